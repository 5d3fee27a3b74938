"""Webhook delivery (Standard Webhooks): every API process delivers the events in `Keys.webhooks` to the endpoints
of their tenants (delivery.py), signed (signing.py), to public addresses only unless the operator allows others
(guard.py)."""
