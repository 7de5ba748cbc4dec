from quantkit.cli import entry

entry()
