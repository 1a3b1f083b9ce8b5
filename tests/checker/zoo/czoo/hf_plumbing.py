"""How transformers 5 plumbs a forward: config defaults merged by a loop over a literal list of
names (``merge_with_config_defaults``), the input embedding found by a class-level layer name with a
default (``get_input_embeddings``), mask functions from a registry object indexed with ``[]``
(``ALL_MASK_ATTENTION_FUNCTIONS``), and a plain forward hook registered at construction
(``enable_input_require_grads``).
"""

import functools

from torch import Tensor, nn

from czoo.servable import ServableLM
from tokenstate.contracts import ForwardInput, entry_point


class Config:
    use_cache = False
    attn_implementation = "sdpa"


def merge_with_config_defaults(func):
    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        names_with_defaults = ["use_cache", "output_attentions"]
        for arg_name in names_with_defaults:
            if kwargs.get(arg_name) is not None:
                arg_value = kwargs[arg_name]
            else:
                arg_value = getattr(self.config, arg_name, None)
            if arg_value is not None:
                kwargs[arg_name] = arg_value
        return func(self, *args, **kwargs)

    return wrapper


def sdpa_mask(input_ids: Tensor) -> None:
    return None  # masks are built from the shape and the positions, never from the ids themselves


def eager_mask(input_ids: Tensor) -> None:
    return None


class MaskInterface:
    _global_mapping = {"sdpa": sdpa_mask, "eager": eager_mask}  # noqa: RUF012 — as transformers writes it

    def __init__(self) -> None:
        self._local_mapping: dict = {}

    def __getitem__(self, key):
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]


ALL_MASK_FUNCTIONS = MaskInterface()


def make_inputs_require_grads(module, inputs, output):
    output.requires_grad_(False)


class TransformersStyleLM(ServableLM):
    _input_embed_layer = "table"

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.config = Config()
        self.table = nn.Embedding.from_pretrained(self.weight.detach().clone(), freeze=True)
        self.table.register_forward_hook(make_inputs_require_grads)

    def get_input_embeddings(self) -> nn.Module:
        name = getattr(self, "_input_embed_layer", "embed_tokens")
        return getattr(self, name, None)

    @merge_with_config_defaults
    def forward(self, input_ids: Tensor, inp: ForwardInput, use_cache=None, output_attentions=None) -> Tensor:
        ALL_MASK_FUNCTIONS[self.config.attn_implementation](input_ids)
        hidden = self.get_input_embeddings()(input_ids.long())
        return self.logits(hidden, inp)


@entry_point
def transformers_plumbing_device(model: TransformersStyleLM, inp: ForwardInput) -> Tensor:
    return model(input_ids=inp.embedding_ids(), inp=inp)


@entry_point
def transformers_plumbing_host(model: TransformersStyleLM, inp: ForwardInput) -> Tensor:
    return model(input_ids=inp.host_tokens.ids, inp=inp)
