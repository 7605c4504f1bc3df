"""Evaluators: the paper's protocol (line PPL, LAMBADA, HellaSwag, ARC-Easy) and the standard one (lm-eval,
token-weighted document PPL), all on one batched scoring primitive."""

from .adapters import adapters_table, evaluate_adapters, take_off_adapters
from .document_ppl import document_perplexity, rolling_windows
from .evaluate import DATA_SOURCES, LM_EVAL_TASK_NAMES, PAPER_LIMITS, PROTOCOLS, TASKS, evaluate
from .lambada import lambada_accuracy
from .line_ppl import line_perplexity
from .lm_eval_bridge import LM_EVAL_LOCAL_TASKS, LmEvalUnavailableError, make_hflm, run_lm_eval
from .multiple_choice import arc_easy_accuracy, choice_requests, hellaswag_accuracy, multiple_choice_accuracy
from .runtime import encode, inference_mode, model_device
from .scoring import ContinuationScore, score_continuations

__all__ = [
    "DATA_SOURCES",
    "LM_EVAL_LOCAL_TASKS",
    "LM_EVAL_TASK_NAMES",
    "PAPER_LIMITS",
    "PROTOCOLS",
    "TASKS",
    "ContinuationScore",
    "LmEvalUnavailableError",
    "adapters_table",
    "arc_easy_accuracy",
    "choice_requests",
    "document_perplexity",
    "encode",
    "evaluate",
    "evaluate_adapters",
    "hellaswag_accuracy",
    "inference_mode",
    "lambada_accuracy",
    "line_perplexity",
    "make_hflm",
    "model_device",
    "multiple_choice_accuracy",
    "rolling_windows",
    "run_lm_eval",
    "score_continuations",
    "take_off_adapters",
]
