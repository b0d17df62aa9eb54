"""Queue again (or fail, after too many tries) running stages whose worker stopped renewing its lease;
send again the messages of queued stages that a dead worker took; deliver what the outbox holds."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from runs.pipeline.dispatch.message_claims import claims_reconcile
from runs.pipeline.dispatch.queue import outbox_flush
from runs.pipeline.lifecycle.stage_services import stages_reconcile


class Command(BaseCommand):
    help = ("Find running stages whose worker was lost (lease lapsed) and queue them again; every worker "
            "already does this every half lease, so this is for an operator or a cron job.")

    def add_arguments(self, parser):
        parser.add_argument("--json", dest="as_json", action="store_true")

    def handle(self, *args, as_json: bool, **opts):
        done = stages_reconcile() + claims_reconcile()
        sent = outbox_flush()
        if sent:
            done.append(f"{sent} message(s) kept back by a broker outage handed to the broker")
        self.stdout.write(json.dumps({"reconciled": done}) if as_json else ("\n".join(done) or "nothing to reconcile"))
