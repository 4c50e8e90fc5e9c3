from bench.cli import entry

entry()
