"""Running a server process, apart from what it serves: the JSON-lines metrics log, health and
reflection, the Prometheus exporter, the progress bar, the port file. Imports only common/."""
