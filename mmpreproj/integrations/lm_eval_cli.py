"""`mmpreproj-lm-eval`: lm-evaluation-harness's own command line, in a process that has imported mmpreproj.

    mmpreproj-lm-eval --model hf --model_args pretrained=BASE,peft=ADAPTER_DIR --tasks lambada_openai

lm-eval loads `peft=` adapters with `PeftModel.from_pretrained`, which reads `peft_type` from the folder's
`adapter_config.json`; peft knows PREPROJ only once mmpreproj is imported (`method/register.py`), so the plain
`lm_eval` command fails on our adapters with peft's `KeyError: 'PREPROJ'`. This entry point imports mmpreproj
first and then hands every argument to lm-eval's `cli_evaluate` unchanged.
"""

from __future__ import annotations

from ..method import PREPROJ  # noqa: F401  (importing the tuner registers PREPROJ with peft before lm-eval reads any adapter)


def main() -> None:
    """Run lm-eval's command line (`lm_eval.__main__.cli_evaluate`) with PREPROJ registered."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        raise SystemExit(f"mmpreproj-lm-eval needs lm-eval: pip install 'mmpreproj[eval]' ({err})") from None
    cli_evaluate()


if __name__ == "__main__":
    main()
