"""The routing service over HTTP: the FastAPI app, its routes, bodies and answers, the guard, uvicorn settings."""
