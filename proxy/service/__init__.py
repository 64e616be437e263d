"""The service: settings, the application and its mount, auth, health, metrics and logs."""
