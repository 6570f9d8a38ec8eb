"""Co-evolution of an agent's harness and weights: ``python train.py [overrides]``.

    python train.py                                  # the main job on CPU (SmolLM2 + LoRA; time: docs/PERF.md)
    python train.py experiment=smoke                 # tiny model, the quickest run
    python train.py mode=harness_only name=h-only    # ablation arms: coevolve | harness_only | model_only | static
    python train.py -m trainer.lr=1e-5,5e-5          # a Hydra sweep, one run directory per override
    accelerate launch train.py model=... rollout=vllm logger=wandb

Configs live in configs/ (schema and field docs: coevo/config/schema.py, or `coevo config show`).
Started again with the same config, a run resumes from its last complete round. An error the
user can fix (a config value, a missing dependency, a run directory) is one line on stderr, exit
status 2 (1 for a run directory in use or damaged); HYDRA_FULL_ERROR=1 shows its stack trace.
"""

import os
import sys

import hydra

from coevo.config.schema import register
from coevo.errors import reported_as_one_line
from coevo.loop.launch import end_rank

register()

if int(os.environ.get("RANK", "0")) > 0:  # one run directory: only rank 0 lets Hydra write its files
    sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg) -> None:  # cfg: a DictConfig
    import coevo

    with reported_as_one_line():
        coevo.run(cfg)


if __name__ == "__main__":
    main()
    end_rank()  # a rank of a multi-process launch skips interpreter finalization (coevo.loop.launch)
