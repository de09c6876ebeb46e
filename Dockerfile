# The image every service of compose.yaml runs: the runner, the workers' app and the examples.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY workers ./workers
COPY examples ./examples
COPY config ./config
RUN pip install --no-cache-dir '.[flower]'
ENV PYTHONUNBUFFERED=1
CMD ["celery", "-A", "workers", "worker", "-l", "info"]
