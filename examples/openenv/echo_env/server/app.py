"""The echo environment's FastAPI app (HTTP and WebSocket sessions):
`uvicorn echo_env.server.app:app --host 127.0.0.1 --port 8000`."""

from openenv.core.env_server.http_server import create_app

from ..models import EchoAction, EchoObservation
from .echo_env_environment import EchoEnvironment

app = create_app(
    EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=64
)


def main(host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    main()
