# The image every service of compose.yaml runs: the runner, the workers' app and the examples.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY workers ./workers
COPY examples ./examples
COPY config ./config
RUN pip install --no-cache-dir '.[flower,console]'
# Run as an unprivileged user: a step's code (and any LLM client it calls) never runs as root.
RUN useradd --create-home --uid 10001 --user-group runner
USER runner
ENV PYTHONUNBUFFERED=1
CMD ["celery", "-A", "workers", "worker", "-l", "info"]
