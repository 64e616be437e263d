"""The addons that make views and streams agree with liveness: settling message views (the scan
and splice), live settling of event streams, and v2 session streams."""
