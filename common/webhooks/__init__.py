"""Webhook events (Standard Webhooks, OpenAI's event payloads): what the tiers emit into Redis (events.py) and what
an operator reads back of their delivery (log.py). Delivering them is the API's (api/webhooks/)."""
