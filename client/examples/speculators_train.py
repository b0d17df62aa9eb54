"""speculators' own trainer (what `speculators train` runs), reporting its curves and checkpoints to eagle3web.

On the cluster, with EAGLE3WEB_URL and EAGLE3WEB_TOKEN set:

    RUN=$(eagle3web runs create-external --name "llama eagle3, cluster B" --config '{"epochs": 3}')   # its id
    EAGLE3WEB_RUN_ID=$RUN torchrun --nproc-per-node 8 speculators_train.py --verifier-name-or-path ... (its flags)
    eagle3web runs end $RUN --status succeeded   # or failed, with --message

Only rank 0 sends (every rank logs the same all-reduced figures). tests/client/test_speculators_handler.py
runs this file under torchrun with speculators' real trainer.
"""
import os

from speculators.train.cli import main
from speculators.train.config import TrainConfig
from speculators.train.logger import setup_root_logger

from eagle3web_client import Client, Eagle3WebMetricsHandler

setup_root_logger()  # speculators' console logging first: the handler goes ahead of it and sees each dict
client = Client(os.environ["EAGLE3WEB_URL"], os.environ["EAGLE3WEB_TOKEN"])
Eagle3WebMetricsHandler(client, int(os.environ["EAGLE3WEB_RUN_ID"])).install()
main(TrainConfig.resolve())
