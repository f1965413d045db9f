"""CLI extensions: each module here defines ``register(app)`` and adds its commands."""
