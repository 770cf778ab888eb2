"""Multi-Conv DAPO training for the memory agent (reproducing MemAgent's RL recipe).

Map: config.py (the one config dataclass), data.py (synthetic and HotpotQA tasks), rollout.py
(trajectories of conversations through the inference Reader), advantage.py (group advantages, dynamic
sampling, rows and loss weights), loss.py (clipped policy gradient, KL), policy.py (model, LoRA,
log-probs), engine.py (the loop, checkpoints), dist.py (torchrun data parallel), remote.py (server
rollouts and weight sync), trainer.py (`memagent train`). Importing this package does not import torch.
"""
