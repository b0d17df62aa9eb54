FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
COPY requirements.txt constraints.txt ./
RUN pip install --no-cache-dir -c constraints.txt -r requirements.txt \
 && pip uninstall -y torchvision torchaudio
COPY . .
EXPOSE 8000
# docker-compose.yml runs collectstatic and migrate first; see .env.example for the variables.
CMD ["gunicorn", "eagle3web.wsgi", "--bind", "0.0.0.0:8000", "--no-control-socket", "--access-logfile", "-"]
