from rlbus.cli import app

app(prog_name="rlbus")
