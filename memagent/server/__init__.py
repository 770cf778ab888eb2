"""An OpenAI-compatible HTTP server over any memagent Backend (`memagent serve`).

Submodules: protocol (wire format, validation), serving (request -> Backend -> response, fault
injection for tests), router (aiohttp routes, command line). Importing this package does not import
aiohttp or torch; `router` does the former, the embedded backend the latter.
"""
