"""Glue for the quantized bases people already use; each submodule is imported on its own (nothing here imports
torchao or bitsandbytes).

    from mmpreproj.integrations.quantized import quantize_frozen_base  # int8 (torchao) / nf4, fp4 (bitsandbytes)

transformers' `Trainer`, TRL's `SFTTrainer` and `accelerate launch` need no glue: the method is a peft method
(`peft.get_peft_model(model, PreProjConfig())`, `SFTTrainer(peft_config=PreProjConfig())`), so their own peft
path checkpoints the adapter alone and resumes it; `mmpreproj.load_adapter` reads what they write.
"""
