"""`python -m memagent.server ...`: the same as `memagent serve ...`."""
import argparse
import sys

from .router import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m memagent.server",
                                 description="Serve a memagent backend over an OpenAI-compatible HTTP API.")
add_arguments(parser)
sys.exit(main(parser.parse_args()))
