"""The server runtime: registered env classes served as an EnvService gRPC server."""

from env_servers.server.app import EnvServer, RunningServer, ServerConfig, serve_forever

__all__ = ["EnvServer", "RunningServer", "ServerConfig", "serve_forever"]
