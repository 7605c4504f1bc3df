"""Parameter counts that need no tuner: `budget` (the injected modules' sizes at a trainable budget, the one
formula `PreProjConfig.for_budget` and the budget study's `train/sizes.py` use) and `report`
(`trainable_report`: how many parameters a model has injected and how many will train). `estimate` (what a
`PreProjConfig` costs on a named shape) takes the tuner's config and stays beside it, `mmpreproj/tuner/estimate.py`.
"""
