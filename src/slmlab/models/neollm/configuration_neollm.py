"""NeoLLM configuration (seed 000): a research transformer in which every mechanism is a switch.

Only the configuration was given by the seed; the maths of each component lives in
``neollm-attention.md`` (A) and ``neollm-residual-embedding.md`` (R). This class accepts every keyword
of the seed under the same name and default, resolves the same derived defaults, raises the same
errors and logs the same warnings. It also computes, in one place, the per-layer schedule the
attention side reads (IHA kind, REPO layers, the resolved rotary width), so no module re-derives it.

It is written the way transformers 5 writes its configs: every field is an annotated class attribute
with its default, ``PretrainedConfig.__init_subclass__`` turns the class into a keyword-only dataclass
whose generated ``__init__`` assigns the fields and hands every other keyword to ``__post_init__``,
and ``__post_init__`` resolves the derived defaults and runs the checks before transformers' own
post-init. (``@strict`` is not applied: its type validators would reject values the seed accepts,
e.g. ``use_lns=1``, and it would wrap the seed's ``ValueError``s in its own error type.)
"""

from __future__ import annotations

import logging

from transformers import PretrainedConfig

from ..registry import InitOnly, KeepsSavedKeys, accept_keywords, config_signature, is_positive_int

logger = logging.getLogger(__name__)

# Residual-flow mechanisms that rewrite the residual topology: at most one may be active (seed rule).
RESIDUAL_FLOW_FLAGS = ("use_laurel", "use_attn_res", "use_stack_memory", "use_siamesenorm")

# Seed keywords that are not stored under their own name. transformers 5 keeps `rope_scaling` as the
# (deprecated) alias property of `rope_parameters`, where __post_init__ puts it; a class attribute of that
# name would hide the property.
INIT_ONLY_KEYWORDS = {"rope_scaling": InitOnly(None, "dict | None")}


def _check_positive(**fields: int) -> None:
    for name, value in fields.items():
        if not is_positive_int(value):
            raise ValueError(f"`{name}` must be a positive integer, got {name}={value!r}.")


@config_signature(INIT_ONLY_KEYWORDS)
class NeoLLMConfig(KeepsSavedKeys, PretrainedConfig):
    """Configuration of NeoLLM: the seed's 83 keywords (82 fields + ``rope_scaling``) and ``use_cache``.

    Defaults are the seed's ``__init__`` signature (which wins over its docstring where they
    disagree, docs/neollm.md#decisions): vocab 64402, d=512, 12 layers, 8 query / 4 KV heads of 64, xIELU MLP
    of 1536, untied head, partial RoPE 0.25, momentum attention, XSA, Hadamard o_proj, learnable
    multipliers, SiameseNorm, Spelling Bee, REPO + REPO-GRAPE from layer ``num_hidden_layers // 3``,
    IHA (P=2, ``"LLLLG"``, automatic window), FANformer maps on the attention (0.125) and MLP
    (0.0625) inputs, dropout 0.1. Keyword-only, as every transformers 5 config; keywords that are not
    fields (``bos_token_id``, ``dtype``, ...) go to ``PretrainedConfig``.

    Args (grouped; see the docs named above for each mechanism):
        vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim, hidden_act, max_position_embeddings, initializer_range,
            rms_norm_eps, tie_word_embeddings: the usual transformer sizes.
        rope_theta, rope_scaling, partial_rotary_factor: rotary positions (docs/neollm-attention.md#positions). ``rope_scaling``
            is kept as given and stored as ``rope_parameters`` (``INIT_ONLY_KEYWORDS``); without it ``rope_parameters`` is
            ``{"rope_type": "default", "rope_theta", "partial_rotary_factor"}`` from those fields. transformers v5's
            ``rope_parameters`` (``{"rope_type", "rope_theta", "factor", ...}``) is honoured too: its ``rope_theta`` and
            ``partial_rotary_factor`` set those fields and a non-default ``rope_type`` is the scaling.
        attention_bias, attention_dropout, dropout_rate: biases on q/k/v, probability dropout,
            block-output + MLP-intermediate dropout.
        use_momentum_attention, momentum_gamma: causal first-difference shear of q/k (docs/neollm-attention.md#momentum).
        use_mea_attention, mea_component_key_value_heads (None -> num_key_value_heads),
            mea_groupnorm_eps: MEA head mixing (docs/neollm-attention.md#mea).
        use_lucid_attention, lucid_attention_eps: LUCID preconditioning (docs/neollm-attention.md#lucid).
        use_affine_scaled_attention, affine_momentum: affine-scaled softmax (docs/neollm-attention.md#affine-scaled-softmax).
        use_xsa, xsa_eps: exclusive self attention (docs/neollm-attention.md#xsa).
        use_directional_routing, directional_routing_k, directional_routing_temp: docs/neollm-attention.md#directional-routing.
        use_attn_res, attn_res_num_blocks: attention residuals over depth (docs/neollm-residual.md#attnres).
        use_stack_memory, stack_d_model, num_mem_heads, stack_slots, stack_memory_cache_size: docs/neollm-residual.md#stackmemory.
        use_fan_residual, fan_ratio, fan_ratio_ffn: FANformer maps (docs/neollm-attention.md#order-of-operations,
            docs/neollm-residual.md#mlp-and-activations) and the FAN value residual
            (docs/neollm-residual.md#value-residual). A ratio of 0 means "no FAN module".
        use_learnable_multipliers, use_embedding_multipliers: learnable multipliers
            (docs/neollm-attention.md#order-of-operations, docs/neollm-residual.md#mlp-and-activations).
        use_lns, use_gpas, use_siamesenorm, siamese_normalized_input, siamese_depth_scaling,
            siamese_attn_x_scale_init, use_embedding_input_norm: norms and residual topology (docs/neollm-residual.md#siamesenorm).
        use_token_generator, generator_*: Leviathan generator (docs/neollm.md#token-generator);
            ``generator_spline_degree`` is documentation only (a value other than 2 warns).
        use_jtokm, jtokm_*: JTok-M modulation and its balance loss (docs/neollm.md#jtok-m).
        use_hadamard_o_proj: Walsh-Hadamard output projection (docs/neollm-attention.md#order-of-operations).
        polynorm_exclusive: PolyNorm replaces the MLP activation (docs/neollm-residual.md#polynorm).
        use_spelling_bee_embeddings: byte-level embedding augmentation (docs/neollm.md#spelling-bee).
        use_repo, repo_start_layer (None -> num_hidden_layers // 3), repo_d_p (None -> hidden_size // 8),
            use_repo_grape, use_repo_goat_prior, repo_goat_num_frequencies, repo_goat_sink_decay:
            learned positions (docs/neollm-attention.md#positions).
        use_laurel, use_laurel_rw, use_laurel_lr, laurel_lr_rank: LAUREL (docs/neollm-residual.md#laurel).
        use_iha, iha_num_pseudo_heads, iha_local_global_pattern, iha_sliding_window,
            iha_global_layers_use_iha: interleaved head attention (docs/neollm-attention.md#iha).
        use_cache: return a decoding cache from ``forward`` by default (not a seed field).

    Raises:
        ValueError: the seed's checks (JTok-M without the generator, JTok-M top-k range, REPO layer
            range, GOAT frequencies / sink decay, IHA pseudo-heads and pattern characters, the
            residual-flow mutual exclusion, LAUREL sub-flags, StackMemory shapes), the generator's and
            JTok-M's sizes when they are on (``generator_k``, ``generator_num_knots``, ``generator_d_seed``,
            ``generator_num_modes``, ``generator_krank``, ``jtokm_num_modes``, ``jtokm_norm_eps``,
            ``jtokm_aux_loss_weight``), plus the head
            layout (``H % H_kv``), positive sizes and an even rotary width, which every model
            built from the seed would need as well.
    """

    model_type = "neollm"
    keys_to_ignore_at_inference = ["aux_loss"]  # Trainer's prediction_step: not a logit

    # Core sizes.
    vocab_size: int = 64402
    hidden_size: int = 512
    intermediate_size: int = 1536
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    hidden_act: str = "xielu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    use_cache: bool = True
    # Rotary positions (and the init-only `rope_scaling`, INIT_ONLY_KEYWORDS).
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    # Attention: projections, dropout and the optional mechanisms (docs/neollm-attention.md).
    attention_bias: bool = False
    attention_dropout: float = 0.1
    use_momentum_attention: bool = True
    momentum_gamma: float = 0.10
    use_mea_attention: bool = False
    mea_component_key_value_heads: int | None = None  # None -> num_key_value_heads
    mea_groupnorm_eps: float = 1e-6
    use_lucid_attention: bool = False
    lucid_attention_eps: float = 1e-6
    use_affine_scaled_attention: bool = False
    affine_momentum: float = 0.9
    use_xsa: bool = True
    xsa_eps: float = 1e-6
    use_directional_routing: bool = False
    directional_routing_k: int = 4
    directional_routing_temp: float = 3.0
    use_hadamard_o_proj: bool = True
    # Residual flow over depth: AttnRes, StackMemory, LAUREL (at most one, with SiameseNorm: RESIDUAL_FLOW_FLAGS).
    use_attn_res: bool = False
    attn_res_num_blocks: int = 4
    use_stack_memory: bool = False
    stack_d_model: int = 32
    num_mem_heads: int = 4
    stack_slots: int = 16
    stack_memory_cache_size: int = 2048
    use_laurel: bool = False
    use_laurel_rw: bool = False
    use_laurel_lr: bool = False
    laurel_lr_rank: int = 32
    # MLP and FANformer maps; block-output + MLP-intermediate dropout.
    use_fan_residual: bool = False
    fan_ratio: float = 0.125
    fan_ratio_ffn: float = 0.0625
    dropout_rate: float = 0.1
    polynorm_exclusive: bool = False
    # Learnable multipliers.
    use_learnable_multipliers: bool = True
    use_embedding_multipliers: bool = False
    # Norms and residual topology.
    use_lns: bool = False
    use_gpas: bool = False
    use_siamesenorm: bool = True
    siamese_normalized_input: bool = True
    siamese_depth_scaling: bool = True
    siamese_attn_x_scale_init: float = 1.0
    use_embedding_input_norm: bool = True
    # Embeddings: Spelling Bee, the Leviathan token generator and JTok-M.
    use_spelling_bee_embeddings: bool = True
    use_token_generator: bool = False
    generator_d_seed: int = 128
    generator_num_modes: int = 8
    generator_num_knots: int = 32
    generator_spline_degree: int = 2  # documentation only
    generator_k: int = 3
    generator_krank: int = 64
    use_jtokm: bool = False
    jtokm_num_experts: int = 4
    jtokm_top_k: int = 2
    jtokm_num_modes: int = 4
    jtokm_aux_loss_weight: float = 1e-4
    jtokm_norm_eps: float = 1e-6
    # Context re-positioning (REPO, GRAPE, GOAT prior).
    use_repo: bool = True
    repo_start_layer: int | None = None  # None -> num_hidden_layers // 3
    repo_d_p: int | None = None  # None -> hidden_size // 8
    use_repo_grape: bool = True
    use_repo_goat_prior: bool = False
    repo_goat_num_frequencies: int = 3
    repo_goat_sink_decay: float = 4.0
    # Interleaved head attention.
    use_iha: bool = True
    iha_num_pseudo_heads: int = 2
    iha_local_global_pattern: str = "LLLLG"
    iha_sliding_window: int | None = None  # None -> automatic
    iha_global_layers_use_iha: bool = False

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are
        not fields: the seed's derived defaults and checks (``_resolve_and_check``), then transformers'
        own post-init with those keywords, then the RoPE scaling. An unknown keyword (a typo) raises
        ``ValueError`` with "did you mean" (:func:`slmlab.models.registry.reject_unknown_keys`)."""
        accept_keywords(self, kwargs)
        rope_scaling = self._take_rope_keywords(kwargs)
        self._resolve_and_check()
        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        super().__post_init__(**{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs})
        # transformers 5.x reads `rope_parameters`; `rope_scaling` is its (deprecated) alias property, so
        # setting the dict once keeps both names in agreement. Set after the base post-init, which would
        # otherwise fill a default `rope_parameters` in. Without a scaling the dict is plain RoPE,
        # {"rope_type": "default", "rope_theta", "partial_rotary_factor"} from the fields (kept as well).
        self.rope_parameters = {"rope_type": "default"} if rope_scaling is None else dict(rope_scaling)
        self.standardize_rope_params()
        self.validate_rope()

    def _take_rope_keywords(self, kwargs: dict) -> dict | None:
        """Pop ``rope_scaling`` and transformers v5's ``rope_parameters`` from ``kwargs``; return the scaling.

        ``rope_parameters`` is the source of truth when given: its ``rope_theta`` and ``partial_rotary_factor``
        set those fields, and a non-default ``rope_type`` is the scaling (unless ``rope_scaling`` is given)."""
        rope_scaling = kwargs.pop("rope_scaling", INIT_ONLY_KEYWORDS["rope_scaling"].default)
        rope_parameters = dict(kwargs.pop("rope_parameters", None) or {})
        self.rope_theta = rope_parameters.pop("rope_theta", self.rope_theta)
        self.partial_rotary_factor = rope_parameters.pop("partial_rotary_factor", self.partial_rotary_factor)
        if rope_scaling is None and rope_parameters.get("rope_type", rope_parameters.get("type", "default")) != "default":
            rope_scaling = rope_parameters
        return rope_scaling

    def _resolve_and_check(self) -> None:
        """The seed's derived defaults and checks, in the seed's order (so the first failing check is the
        seed's), then the seed's type normalisation of a few fields. Checks read the values as given."""
        self._resolve_tying()
        self._warn_inactive_embedding_multipliers()
        self._check_jtokm()
        if self.use_token_generator:
            self._check_generator()
        if self.use_jtokm:
            self._check_jtokm_fields()
        if self.repo_start_layer is None:
            self.repo_start_layer = self.num_hidden_layers // 3
        if self.repo_d_p is None:
            self.repo_d_p = self.hidden_size // 8
        self._check_repo()
        self._check_attention_options()
        if self.use_iha:
            self._check_iha()
        self._check_residual_flow()
        self._check_layout()
        if self.mea_component_key_value_heads is None:
            self.mea_component_key_value_heads = self.num_key_value_heads
        else:
            self.mea_component_key_value_heads = int(self.mea_component_key_value_heads)
        for name in ("use_lns", "use_gpas", "use_siamesenorm", "siamese_normalized_input", "siamese_depth_scaling",
                     "iha_global_layers_use_iha"):
            setattr(self, name, bool(getattr(self, name)))
        self.siamese_attn_x_scale_init = float(self.siamese_attn_x_scale_init)
        self.repo_goat_num_frequencies = int(self.repo_goat_num_frequencies)
        self.repo_goat_sink_decay = float(self.repo_goat_sink_decay)

    # -- the seed's checks, one concern each ---------------------------------------------------
    def _resolve_tying(self) -> None:
        if self.use_token_generator and self.tie_word_embeddings:
            logger.warning(
                "`use_token_generator=True` is incompatible with `tie_word_embeddings=True`; setting "
                "`tie_word_embeddings=False`: the generator replaces the lookup table, so the output head "
                "must stay an independent dense projection."
            )
            self.tie_word_embeddings = False

    def _warn_inactive_embedding_multipliers(self) -> None:
        if not self.use_embedding_multipliers:
            return
        if not self.use_learnable_multipliers:
            reason = "`use_learnable_multipliers=False`; no embedding multiplier parameters are created"
        elif self.use_token_generator:
            reason = "`use_token_generator=True` replaces the embedding matrix with the Leviathan generator"
        elif self.tie_word_embeddings:
            reason = "`tie_word_embeddings=True`; multipliers would break input/output parameter sharing"
        else:
            return
        logger.warning("`use_embedding_multipliers=True` is inactive because %s.", reason)

    def _check_jtokm(self) -> None:
        if self.use_jtokm and not self.use_token_generator:
            raise ValueError(
                "`use_jtokm=True` requires `use_token_generator=True`: the JTok-M surfaces live on the "
                "generator's latent coordinate z~. Set `use_token_generator=True` or disable JTok-M."
            )
        top_k, num_experts = self.jtokm_top_k, self.jtokm_num_experts
        if self.use_jtokm and not (1 <= top_k < num_experts):
            raise ValueError(
                "`jtokm_top_k` must satisfy 1 <= jtokm_top_k < jtokm_num_experts, "
                f"got jtokm_top_k={top_k}, jtokm_num_experts={num_experts}."
            )

    def _check_generator(self) -> None:
        """The Leviathan generator's sizes (docs/neollm.md#token-generator); the degree is documentation only."""
        k, num_knots, spline_degree = self.generator_k, self.generator_num_knots, self.generator_spline_degree
        if int(k) < 1:
            raise ValueError(f"`generator_k` must be >= 1 (coordinates per token id), got generator_k={k!r}.")
        if int(num_knots) < 2:
            raise ValueError(f"`generator_num_knots` must be >= 2 (knots on [0, 1]), got generator_num_knots={num_knots!r}.")
        _check_positive(
            generator_d_seed=self.generator_d_seed, generator_num_modes=self.generator_num_modes,
            generator_krank=self.generator_krank,
        )
        if spline_degree != 2:
            logger.warning(
                "`generator_spline_degree`=%s is documentation only: the generator always uses the closed-form "
                "quadratic (degree 2) basis.", spline_degree,
            )

    def _check_jtokm_fields(self) -> None:
        norm_eps, aux_loss_weight = self.jtokm_norm_eps, self.jtokm_aux_loss_weight
        _check_positive(jtokm_num_modes=self.jtokm_num_modes)
        if not float(norm_eps) > 0.0:
            raise ValueError(f"`jtokm_norm_eps` must be > 0, got jtokm_norm_eps={norm_eps!r}; the seed default is 1e-6.")
        if not float(aux_loss_weight) >= 0.0:
            raise ValueError(
                f"`jtokm_aux_loss_weight` must be >= 0, got jtokm_aux_loss_weight={aux_loss_weight!r}; the seed default is 1e-4."
            )

    def _check_repo(self) -> None:
        """The REPO layer range (with any REPO flag) and the GOAT prior's sizes (with GOAT)."""
        start, layers = self.repo_start_layer, self.num_hidden_layers
        if self.any_repo and not (0 <= start < layers):
            raise ValueError(
                "`repo_start_layer` must satisfy 0 <= repo_start_layer < num_hidden_layers, "
                f"got repo_start_layer={start}, num_hidden_layers={layers}."
            )
        if not self.use_repo_goat_prior:
            return
        head_dim, num_frequencies, sink_decay = self.head_dim, self.repo_goat_num_frequencies, self.repo_goat_sink_decay
        if num_frequencies < 0:
            raise ValueError(f"`repo_goat_num_frequencies` must be >= 0, got {num_frequencies}.")
        if sink_decay <= 0.0:
            raise ValueError(f"`repo_goat_sink_decay` must be > 0, got {sink_decay}.")
        extra = 2 * int(num_frequencies) + 2
        if (head_dim + extra) % 8:
            logger.warning(
                "`use_repo_goat_prior=True` appends %d prior channels to head_dim=%d, giving internal attention "
                "dim=%d; some FlashAttention builds prefer dimensions divisible by 8 (the default "
                "repo_goat_num_frequencies=3 gives +8).",
                extra, head_dim, head_dim + extra,
            )

    def _check_attention_options(self) -> None:
        """MEA heads, the affine EMA momentum, routing's K and τ, and the eps of every enabled option
        (docs/neollm-attention.md#configuration)."""
        mea_heads, head_dim = self.mea_component_key_value_heads, self.head_dim
        if mea_heads is not None and int(mea_heads) < 1:
            raise ValueError(
                f"`mea_component_key_value_heads` must be >= 1, got {mea_heads}; "
                "set a positive head count, or None to use num_key_value_heads."
            )
        if not 0.0 <= float(self.affine_momentum) < 1.0:
            raise ValueError(f"`affine_momentum` must be in [0, 1), got {self.affine_momentum}; the seed default is 0.9.")
        routing_k, routing_temp = self.directional_routing_k, self.directional_routing_temp
        if self.use_directional_routing and not 1 <= int(routing_k) < head_dim:
            raise ValueError(
                f"`directional_routing_k` must satisfy 1 <= k < head_dim={head_dim}, got {routing_k}; "
                f"pick a direction count between 1 and {head_dim - 1}."
            )
        if self.use_directional_routing and not float(routing_temp) > 0.0:
            raise ValueError(f"`directional_routing_temp` must be > 0, got {routing_temp}; the seed default is 3.0.")
        eps = {"mea_groupnorm_eps": self.use_mea_attention, "lucid_attention_eps": self.use_lucid_attention,
               "xsa_eps": self.use_xsa}
        for name, enabled in eps.items():
            value = getattr(self, name)
            if enabled and not float(value) > 0.0:
                raise ValueError(f"`{name}` must be > 0 when its option is on, got {value}; use e.g. 1e-6.")

    def _check_iha(self) -> None:
        num_pseudo_heads, window = self.iha_num_pseudo_heads, self.iha_sliding_window
        if num_pseudo_heads < 1:
            raise ValueError(f"`iha_num_pseudo_heads` must be >= 1, got {num_pseudo_heads}.")
        cleaned = str(self.iha_local_global_pattern).upper().strip()
        if not cleaned:
            raise ValueError("`iha_local_global_pattern` must not be empty when `use_iha=True`.")
        bad = sorted(set(cleaned) - {"L", "G"})
        if bad:
            raise ValueError(f"`iha_local_global_pattern` only accepts 'L' and 'G'. Got invalid characters: {bad}.")
        if window is not None and int(window) < 1:
            raise ValueError(f"`iha_sliding_window` must be None (automatic) or an int >= 1, got {window!r}.")

    def _check_residual_flow(self) -> None:
        """At most one residual-flow mechanism, then LAUREL's sub-variants, AttnRes's blocks and StackMemory's shapes."""
        active = [name for name in RESIDUAL_FLOW_FLAGS if getattr(self, name)]
        if len(active) > 1:
            raise ValueError(
                "Enable at most one residual-flow mechanism among `use_laurel`, `use_attn_res`, "
                f"`use_stack_memory`, and `use_siamesenorm`. Active flags: {active}."
            )
        hidden, rank = self.hidden_size, self.laurel_lr_rank
        if self.use_laurel and not self.use_laurel_rw and not self.use_laurel_lr:
            raise ValueError(
                "`use_laurel=True` requires at least one sub-variant to be active: "
                "set `use_laurel_rw=True` and/or `use_laurel_lr=True`."
            )
        if self.use_laurel and self.use_laurel_lr and not (1 <= rank <= hidden):
            raise ValueError(
                f"`laurel_lr_rank` must satisfy 1 <= laurel_lr_rank <= hidden_size={hidden} when "
                f"`use_laurel_lr=True`, got laurel_lr_rank={rank}."
            )
        if self.use_attn_res:
            self._check_attn_res()
        if self.use_stack_memory:
            d_model, heads = self.stack_d_model, self.num_mem_heads
            _check_positive(stack_d_model=d_model, num_mem_heads=heads, stack_slots=self.stack_slots)
            if d_model % heads:
                raise ValueError(
                    "`stack_d_model` must be divisible by `num_mem_heads`, "
                    f"got stack_d_model={d_model}, num_mem_heads={heads}."
                )

    def _check_attn_res(self) -> None:
        num_blocks, num_layers = self.attn_res_num_blocks, self.num_hidden_layers
        if num_blocks < 0:
            raise ValueError(
                f"`attn_res_num_blocks` must be >= 0 (0 = full AttnRes, one block per layer), got {num_blocks}."
            )
        if num_blocks > num_layers:
            logger.info(
                "`attn_res_num_blocks`=%d exceeds num_hidden_layers=%d; it behaves as %d (one block per layer).",
                num_blocks, num_layers, num_layers,
            )

    def _check_layout(self) -> None:
        """Positive sizes, ``H % H_kv == 0`` and an even, positive rotary width."""
        heads, kv_heads, head_dim, rotary_factor = (
            self.num_attention_heads, self.num_key_value_heads, self.head_dim, self.partial_rotary_factor
        )
        _check_positive(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=head_dim, max_position_embeddings=self.max_position_embeddings,
        )
        if heads % kv_heads:
            raise ValueError(
                f"`num_attention_heads` ({heads}) must be divisible by `num_key_value_heads` ({kv_heads})."
            )
        rot = int(head_dim * rotary_factor)
        if not (0.0 < rotary_factor <= 1.0) or rot <= 0 or rot % 2:
            raise ValueError(
                f"`partial_rotary_factor`={rotary_factor} gives int(head_dim * factor) = {rot} rotary channels of "
                f"head_dim={head_dim}; it must be a positive even number."
            )

    # -- derived, per-layer schedule (docs/neollm-attention.md#configuration) -------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        """``r_d = int(head_dim * partial_rotary_factor)``, the rotated channels of each head."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def any_repo(self) -> bool:
        """Any REPO flag turns the coordinate path on at ``repo_start_layer`` (docs/neollm-attention.md#positions)."""
        return bool(self.use_repo or self.use_repo_grape or self.use_repo_goat_prior)

    def is_repo_layer(self, layer_idx: int) -> bool:
        """True where layer ``layer_idx`` uses learned REPO positions instead of integer RoPE."""
        return self.any_repo and layer_idx >= self.repo_start_layer

    def iha_kind(self, layer_idx: int) -> str:
        """IHA kind of a layer (docs/neollm-attention.md#configuration): ``"none"``, ``"mix"`` (P=1, every layer), ``"local"`` ('L'
        with a sliding window) or ``"global"`` ('G' with ``iha_global_layers_use_iha``)."""
        if not self.use_iha:
            return "none"
        if self.iha_num_pseudo_heads == 1:
            return "mix"
        pattern = str(self.iha_local_global_pattern).upper().strip()
        if pattern[layer_idx % len(pattern)] == "L":
            return "local"
        return "global" if self.iha_global_layers_use_iha else "none"

    @property
    def layer_attention_kinds(self) -> list[str]:
        """One ``"<iha kind>/<rope|repo>"`` entry per layer, e.g. ``"local/rope"``; for audits and logs."""
        return [
            f"{self.iha_kind(i)}/{'repo' if self.is_repo_layer(i) else 'rope'}" for i in range(self.num_hidden_layers)
        ]


__all__ = ["NeoLLMConfig", "RESIDUAL_FLOW_FLAGS"]
