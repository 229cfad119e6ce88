"""Multi-device training of litgpt recipes under DDP, FSDP, FSDP2 and DeepSpeed (see train.py)."""
