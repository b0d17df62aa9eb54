"""Who holds which rank of a training across nodes (a run's train_nodes > 1): one row per rank and attempt."""
from __future__ import annotations

from django.db import models


class TrainingNode(models.Model):
    """One rank of one attempt of a training under torchrun --nnodes (workers.stages.train.processes.nodes). The worker
    that started the attempt holds rank 0 and writes these rows; each other rank's message is taken by a
    worker that is not already holding a rank of this attempt. Rank 0's row carries the rendezvous endpoint."""

    class Status(models.TextChoices):
        WAITING = "waiting"  # its message is in the queue
        JOINED = "joined"  # a worker holds it and waits for the gang (no GPU held)
        RUNNING = "running"  # its torchrun runs
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    training = models.ForeignKey("runs.TrainingRun", on_delete=models.CASCADE, related_name="nodes")
    attempt = models.PositiveIntegerField(help_text="the training's StageAttempt number")
    stage_started_at = models.DateTimeField(help_text="the attempt's start: a later attempt's rows are not these")
    rank = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    host = models.CharField(max_length=255, blank=True)
    endpoint = models.CharField(max_length=300, blank=True, help_text="rank 0: the c10d rendezvous, host:port")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WAITING)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)

    class Meta:
        ordering = ["training", "attempt", "rank"]
        constraints = [models.UniqueConstraint(fields=["training", "attempt", "rank"], name="unique_training_node")]

    def __str__(self) -> str:
        return f"training {self.training_id} attempt {self.attempt} rank {self.rank}"
