"""The OpenAI-compatible HTTP front: validates, renders chat templates, enqueues jobs, streams their events."""
