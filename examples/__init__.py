"""Worked examples of what a deployment adds to the gateway (``GATEWAY_PLUGIN=examples.agent``)."""
