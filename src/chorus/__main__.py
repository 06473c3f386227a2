from chorus.cli import app

app()
