"""The run pages: ``/runs``, ``/runs/{id}`` (live), ``/pending``, served by ``kestrel serve``
on its HTTP listener, and the same run page as one HTML file (``kestrel runs export``).

- ``add_web_routes(app, chat, config)`` / ``web_routes(chat, config)``: the routes
  (``adapters.web.app``); ``SecureRunner``: the runner whose own error answers are secured too;
- ``WebConfig.from_settings(settings.web, environ)``: the operators' token and the link
  signer (``adapters.web.auth``);
- ``export_html(chat, run_id)`` and ``render_run_page(page, standalone=True)``: the export.
"""

from adapters.web.app import SecureRunner, add_web_routes, web_routes
from adapters.web.auth import WebConfig
from adapters.web.export import export_html
from adapters.web.render import load_run_page, render_run_page

__all__ = [
    "SecureRunner",
    "WebConfig",
    "add_web_routes",
    "export_html",
    "load_run_page",
    "render_run_page",
    "web_routes",
]
