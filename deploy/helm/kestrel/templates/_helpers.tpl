{{- define "kestrel.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kestrel.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kestrel.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kestrel.secretName" -}}
{{- .Values.secret.existingSecret | default (include "kestrel.fullname" .) -}}
{{- end -}}

{{/* The secret's keys read as files: those given, or those of secret.values. */}}
{{- define "kestrel.fileKeys" -}}
{{- $keys := .Values.secret.keys -}}
{{- if not .Values.secret.existingSecret -}}
{{- $keys = keys .Values.secret.values | sortAlpha -}}
{{- end -}}
{{- range $keys -}}
{{- if ne . "KESTREL_DATABASE_URL" }}
- {{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kestrel.hasDatabaseUrl" -}}
{{- if .Values.secret.existingSecret -}}
{{- if has "KESTREL_DATABASE_URL" .Values.secret.keys }}yes{{ end -}}
{{- else -}}
{{- if hasKey .Values.secret.values "KESTREL_DATABASE_URL" }}yes{{ end -}}
{{- end -}}
{{- end -}}
