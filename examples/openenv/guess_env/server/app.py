"""The guessing game's FastAPI app (HTTP and WebSocket sessions):
`uvicorn guess_env.server.app:app --host 127.0.0.1 --port 8000`."""

from openenv.core.env_server.http_server import create_app

from ..models import GuessAction, GuessObservation
from .guess_env_environment import GuessEnvironment

app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=64
)


def main(host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    main()
