"""Running a server process, apart from what it serves: the JSON-lines metrics log, health and
reflection, the Prometheus exporter and its HTTP server, the progress bar and lines, the port file.
Imports only common/."""
