"""Glue for the trainers people already use; each submodule is imported on its own (nothing here imports
transformers, TRL, torchao or bitsandbytes).

    from mmpreproj.integrations.transformers import PreProjTrainer   # a drop-in transformers.Trainer
    from mmpreproj.integrations.trl import PreProjSFTTrainer         # a drop-in trl.SFTTrainer
    from mmpreproj.integrations.quantized import quantize_frozen_base  # int8 (torchao) / nf4, fp4 (bitsandbytes)

`accelerate launch` needs no glue: our trainer and both classes above read the launcher's environment.
"""

__all__: list[str] = []
