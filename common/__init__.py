"""What the API and the workers share: the job contract, Redis key names, settings, servable rules."""
