"""An OpenAI-compatible HTTP server over any memagent Backend (`memagent serve`).

Submodules: protocol (wire format, validation), serving (request -> Backend -> response, fault
injection for tests), router (aiohttp routes, command line); for reading over HTTP (docs/serve.md):
jobs (documents, reading jobs, events, resume), memchat (the `memagent` chat model), api (the /api
routes and the page in static/), stream (server-sent events), guard (connection cap, timeouts, logs).
Importing this package does not import aiohttp or torch; `router` does the former, the embedded
backend the latter.
"""
