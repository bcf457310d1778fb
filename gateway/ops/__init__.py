"""The operator surface: the API under /api/v1, its actions on lanes, the ops page and CLI.

`api.OpsApi` serves the routes; `reads` reads lanes from the store without taking them;
`actions` and `carry` carry an action to the worker that holds the lane's session; `auth`
checks bearer tokens; `errors` holds the error envelope and request ids.
"""
