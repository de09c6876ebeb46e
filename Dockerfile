# The image every service of compose.yaml runs: the runner, the workers' app and the examples.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY runner ./runner
COPY workers ./workers
COPY examples ./examples
COPY config ./config
# Exactly the versions the tests ran with (constraints.txt): runner relies on internals of
# kombu and Celery (runner/distributed/broker.py), so the image never picks a newer release.
RUN pip install --no-cache-dir -c constraints.txt .
# Run as an unprivileged user: a step's code (and any LLM client it calls) never runs as root.
RUN useradd --create-home --uid 10001 --user-group runner
USER runner
ENV PYTHONUNBUFFERED=1
CMD ["celery", "-A", "workers", "worker", "-l", "info"]
