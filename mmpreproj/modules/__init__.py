"""The paper's math, torch only: the pre-projection, the content skip, the wrapper base and the native block."""

from .base_wrapper import BaseLayerWrapper as BaseLayerWrapper
from .block import Block as Block
from .block import KVCache as KVCache
from .block import Mlp as Mlp
from .block import SelfAttention as SelfAttention
from .preproj import ACTIVATIONS as ACTIVATIONS
from .preproj import PREPROJ_INITS as PREPROJ_INITS
from .preproj import PreProjection as PreProjection
from .skip import ContentSkip as ContentSkip
