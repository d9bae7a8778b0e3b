"""Training: config, optimisers/schedules, atomic checkpoints, DDP, metrics and the Trainer."""

from .checkpoint import CheckpointError, load_training_state, resolve_checkpoint, save_checkpoint
from .config import OptimConfig, RunConfig, ScheduleConfig, load_config
from .trainer import Trainer, TrainingDiverged, TrainState

__all__ = [
    "CheckpointError", "OptimConfig", "RunConfig", "ScheduleConfig", "Trainer", "TrainingDiverged", "TrainState",
    "load_config", "load_training_state", "resolve_checkpoint", "save_checkpoint",
]
