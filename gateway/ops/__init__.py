"""The operator front end: the API under /api/v1, the ops page and CLI.

`api.OpsApi` serves the routes, composed of route groups (`api.lanes`, `api.audit`,
`api.deliveries`, `api.actions`); `cli` is ``gateway ops``, the API from a terminal; `reads`
reads lanes from the store without taking them; `checks` judges a request against a lane; an
action goes to the worker that holds the lane's session as `gateway.operator_actions` describes
(this package imports it, never the other way round); `auth` checks bearer tokens; `errors`
holds the error envelope and request ids.
"""
