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

{{/* The secret's keys: those given, or those of secret.values. */}}
{{- define "kestrel.secretKeys" -}}
{{- if .Values.secret.existingSecret -}}
{{- toYaml .Values.secret.keys -}}
{{- else -}}
{{- toYaml (keys .Values.secret.values | sortAlpha) -}}
{{- end -}}
{{- end -}}

{{/* The secrets Kestrel reads from a file (NAME_FILE) and hides from catalog commands:
     bot/config/sources.py's SECRET_FILE_VARIABLES (a test holds the two lists equal). */}}
{{- define "kestrel.fileVariables" -}}
{{- toYaml (list "SLACK_BOT_TOKEN" "SLACK_SIGNING_SECRET" "SLACK_APP_TOKEN" "DISCORD_TOKEN" "OPENAI_API_KEY" "KESTREL_WEB_TOKEN" "KESTREL_WEB_SECRET") -}}
{{- end -}}

{{/* The keys mounted as files: only those Kestrel reads so, and hides. */}}
{{- define "kestrel.fileKeys" -}}
{{- $files := include "kestrel.fileVariables" . | fromYamlArray -}}
{{- range (include "kestrel.secretKeys" . | fromYamlArray) -}}
{{- if has . $files }}
- {{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Every other key is a variable: the database URL, and a secret a catalog's env: passes on. */}}
{{- define "kestrel.envKeys" -}}
{{- $files := include "kestrel.fileVariables" . | fromYamlArray -}}
{{- range (include "kestrel.secretKeys" . | fromYamlArray) -}}
{{- if not (has . $files) }}
- {{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The replicas' shared journal must be PostgreSQL: without it each pod kept a SQLite file of
     its own under /etc/kestrel, which the read-only root refuses (and an emptyDir would lose
     with the pod, and share with no other replica). Given as the Secret's
     KESTREL_DATABASE_URL, a variable of extraEnv, or database: postgresql://… in config. */}}
{{- define "kestrel.requireDatabase" -}}
{{- $keys := include "kestrel.secretKeys" . | fromYamlArray -}}
{{- $extra := list -}}
{{- range .Values.extraEnv }}{{ $extra = append $extra .name }}{{ end -}}
{{- $inConfig := regexMatch "(?m)^database:\\s*[\"']?postgres(ql)?://" .Values.config -}}
{{- if not (or (has "KESTREL_DATABASE_URL" $keys) (has "KESTREL_DATABASE_URL" $extra) $inConfig) -}}
{{- fail "no database: set KESTREL_DATABASE_URL=postgresql://… in the Secret (secret.values, or secret.keys of secret.existingSecret) or in extraEnv: the replicas share one PostgreSQL journal" -}}
{{- end -}}
{{- end -}}

{{/* No secret where every reader of the release sees it: kestrel.yaml is a ConfigMap and
     extraEnv's values are the Deployment's spec, which `kubectl get -o yaml` shows to anyone
     allowed to read them (far more people than may read a Secret), and `helm get values` too.
     Refused: openai_api_key or a URL's password in config, and in extraEnv a value for a
     secret Kestrel reads (PGPASSWORD too) or a URL with a password (user:password@, or a
     ?password= parameter, which libpq and asyncpg take too). openai_api_key is read as YAML
     reads it (quoted, in flow style; empty is no key). The refusal names where, never the
     value. */}}
{{- define "kestrel.noSecretInTheOpen" -}}
{{- $where := "put it in the Secret (secret.values, or secret.keys of secret.existingSecret) or give extraEnv a valueFrom.secretKeyRef; a database URL may leave its password out, with PGPASSWORD in the Secret" -}}
{{- $withPassword := "[A-Za-z][A-Za-z0-9+.-]*://([^\\s/@:]*:[^\\s/@]+@|[^\\s#]*[?&]password=[^\\s&#])" -}}
{{- if get (fromYaml .Values.config) "openai_api_key" -}}
{{- fail (printf "config holds openai_api_key, which a ConfigMap shows to anyone who may read it: %s" $where) -}}
{{- end -}}
{{- if regexMatch $withPassword .Values.config -}}
{{- fail (printf "config holds a URL with a password, which a ConfigMap shows to anyone who may read it: %s" $where) -}}
{{- end -}}
{{- $secrets := append (include "kestrel.fileVariables" . | fromYamlArray) "PGPASSWORD" -}}
{{- range .Values.extraEnv -}}
{{- /* $(NAME), which Kubernetes expands from a variable before it (a secretKeyRef's), is no
       secret in the spec: a DSN composed so (postgresql://kestrel:$(PG_PASS)@pg/kestrel)
       holds none, nor does a value that is nothing else, or empty. */ -}}
{{- $written := regexReplaceAll "\\$\\([A-Za-z_][A-Za-z0-9_]*\\)" (toString (.value | default "")) "" -}}
{{- if $written -}}
{{- if has .name $secrets -}}
{{- fail (printf "extraEnv %s is a secret, which the pod's spec shows to anyone who may read it: %s" .name $where) -}}
{{- end -}}
{{- if regexMatch $withPassword $written -}}
{{- fail (printf "extraEnv %s holds a URL with a password, which the pod's spec shows to anyone who may read it: %s" .name $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The shutdown grace has one place, replica.shutdownGraceSeconds, which sets both the
     variable and the pod's terminationGracePeriodSeconds. Given in extraEnv it won (of two
     variables of a name the later does), and the kubelet killed a replica still waiting for a
     command; given in config (or extraEnv's KESTREL_REPLICA) the chart's variable won, and the
     grace asked for was silently not kept. */}}
{{- define "kestrel.oneShutdownGrace" -}}
{{- $where := "set replica.shutdownGraceSeconds, which sets it and the pod's terminationGracePeriodSeconds with it" -}}
{{- $replica := get (fromYaml .Values.config) "replica" -}}
{{- if and (kindIs "map" $replica) (hasKey $replica "shutdown_grace_seconds") -}}
{{- fail (printf "config sets replica.shutdown_grace_seconds, which the chart's variable overrides: %s" $where) -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- $name := upper (toString .name) -}}
{{- if eq $name "KESTREL_REPLICA__SHUTDOWN_GRACE_SECONDS" -}}
{{- fail (printf "extraEnv %s sets the shutdown grace past the pod's terminationGracePeriodSeconds: %s" .name $where) -}}
{{- end -}}
{{- if and (eq $name "KESTREL_REPLICA") (contains "shutdown_grace_seconds" (toString (.value | default ""))) -}}
{{- fail (printf "extraEnv %s sets replica.shutdown_grace_seconds, which the chart's variable overrides: %s" .name $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
