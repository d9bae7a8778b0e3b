"""NeoLLM configuration (seed 000): a research transformer in which every mechanism is a switch.

Only the configuration was given by the seed; the maths of each component lives in
``neollm-attention.md`` (A) and ``neollm-residual-embedding.md`` (R). This class accepts every keyword
of the seed under the same name and default, resolves the same derived defaults, raises the same
errors and logs the same warnings. It also computes, in one place, the per-layer schedule the
attention side reads (IHA kind, REPO layers, the resolved rotary width), so no module re-derives it.
"""

from __future__ import annotations

import logging

from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

# Residual-flow mechanisms that rewrite the residual topology: at most one may be active (seed rule).
RESIDUAL_FLOW_FLAGS = ("use_laurel", "use_attn_res", "use_stack_memory", "use_siamesenorm")


def _check_positive(**fields: int) -> None:
    for name, value in fields.items():
        if int(value) <= 0:
            raise ValueError(f"`{name}` must be a positive integer, got {name}={value!r}.")


class NeoLLMConfig(PretrainedConfig):
    """Configuration of NeoLLM: 83 constructor fields, most of them component switches.

    Defaults are the seed's ``__init__`` signature (which wins over its docstring where they
    disagree, docs/neollm.md#decisions): vocab 64402, d=512, 12 layers, 8 query / 4 KV heads of 64, xIELU MLP
    of 1536, untied head, partial RoPE 0.25, momentum attention, XSA, Hadamard o_proj, learnable
    multipliers, SiameseNorm, Spelling Bee, REPO + REPO-GRAPE from layer ``num_hidden_layers // 3``,
    IHA (P=2, ``"LLLLG"``, automatic window), FANformer maps on the attention (0.125) and MLP
    (0.0625) inputs, dropout 0.1.

    Args (grouped; see the docs named above for each mechanism):
        vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim, hidden_act, max_position_embeddings, initializer_range,
            rms_norm_eps, tie_word_embeddings: the usual transformer sizes.
        rope_theta, rope_scaling, partial_rotary_factor: rotary positions (docs/neollm-attention.md#positions). ``rope_scaling``
            is kept as given (``None`` by default) and also stored as ``rope_parameters``. transformers v5's
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

    def __init__(
        self,
        vocab_size=64402,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        hidden_act="xielu",
        max_position_embeddings=32768,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling=None,
        partial_rotary_factor=0.25,
        attention_bias=False,
        attention_dropout=0.1,
        head_dim=64,
        use_momentum_attention=True,
        momentum_gamma=0.10,
        use_mea_attention=False,
        mea_component_key_value_heads=None,
        mea_groupnorm_eps=1e-6,
        use_lucid_attention=False,
        lucid_attention_eps=1e-6,
        use_affine_scaled_attention=False,
        affine_momentum=0.9,
        use_xsa=True,
        xsa_eps=1e-6,
        use_directional_routing=False,
        directional_routing_k=4,
        directional_routing_temp=3.0,
        use_attn_res=False,
        attn_res_num_blocks=4,
        use_stack_memory=False,
        stack_d_model=32,
        num_mem_heads=4,
        stack_slots=16,
        stack_memory_cache_size=2048,
        use_fan_residual=False,
        fan_ratio=0.125,
        fan_ratio_ffn=0.0625,
        dropout_rate=0.1,
        use_learnable_multipliers=True,
        use_embedding_multipliers=False,
        use_lns=False,
        use_gpas=False,
        use_siamesenorm=True,
        siamese_normalized_input=True,
        siamese_depth_scaling=True,
        siamese_attn_x_scale_init=1.0,
        use_embedding_input_norm=True,
        use_token_generator=False,
        generator_d_seed=128,
        generator_num_modes=8,
        generator_num_knots=32,
        generator_spline_degree=2,
        generator_k=3,
        generator_krank=64,
        use_jtokm=False,
        jtokm_num_experts=4,
        jtokm_top_k=2,
        jtokm_num_modes=4,
        jtokm_aux_loss_weight=1e-4,
        jtokm_norm_eps=1e-6,
        use_hadamard_o_proj=True,
        polynorm_exclusive=False,
        use_spelling_bee_embeddings=True,
        use_repo=True,
        repo_start_layer=None,
        repo_d_p=None,
        use_repo_grape=True,
        use_repo_goat_prior=False,
        repo_goat_num_frequencies=3,
        repo_goat_sink_decay=4.0,
        use_laurel=False,
        use_laurel_rw=False,
        use_laurel_lr=False,
        laurel_lr_rank=32,
        use_iha=True,
        iha_num_pseudo_heads=2,
        iha_local_global_pattern="LLLLG",
        iha_sliding_window=None,
        iha_global_layers_use_iha=False,
        use_cache=True,
        **kwargs,
    ):
        # A config.json written by the seed's class carries HF bookkeeping we recompute here.
        kwargs.pop("auto_map", None)
        # transformers v5's `rope_parameters` is the source of truth when given: its `rope_theta` and
        # `partial_rotary_factor` set those fields, and a non-default `rope_type` is the scaling.
        rope_parameters = dict(kwargs.pop("rope_parameters", None) or {})
        rope_theta = rope_parameters.pop("rope_theta", rope_theta)
        partial_rotary_factor = rope_parameters.pop("partial_rotary_factor", partial_rotary_factor)
        if rope_scaling is None and rope_parameters.get("rope_type", rope_parameters.get("type", "default")) != "default":
            rope_scaling = rope_parameters

        tie_word_embeddings = self._resolve_tying(use_token_generator, tie_word_embeddings)
        self._warn_inactive_embedding_multipliers(
            use_embedding_multipliers, use_learnable_multipliers, use_token_generator, tie_word_embeddings
        )
        self._check_jtokm(use_jtokm, use_token_generator, jtokm_top_k, jtokm_num_experts)
        if use_token_generator:
            self._check_generator(
                generator_k, generator_num_knots, generator_spline_degree, generator_d_seed=generator_d_seed,
                generator_num_modes=generator_num_modes, generator_krank=generator_krank,
            )
        if use_jtokm:
            self._check_jtokm_fields(jtokm_num_modes, jtokm_norm_eps, jtokm_aux_loss_weight)

        if repo_start_layer is None:
            repo_start_layer = num_hidden_layers // 3
        if repo_d_p is None:
            repo_d_p = hidden_size // 8
        any_repo = bool(use_repo or use_repo_grape or use_repo_goat_prior)
        if any_repo and not (0 <= repo_start_layer < num_hidden_layers):
            raise ValueError(
                "`repo_start_layer` must satisfy 0 <= repo_start_layer < num_hidden_layers, "
                f"got repo_start_layer={repo_start_layer}, num_hidden_layers={num_hidden_layers}."
            )
        if use_repo_goat_prior:
            self._check_goat(head_dim, repo_goat_num_frequencies, repo_goat_sink_decay)
        self._check_attention_options(
            head_dim=head_dim, mea_component_key_value_heads=mea_component_key_value_heads,
            affine_momentum=affine_momentum, use_directional_routing=use_directional_routing,
            directional_routing_k=directional_routing_k, directional_routing_temp=directional_routing_temp,
            eps={"mea_groupnorm_eps": (use_mea_attention, mea_groupnorm_eps),
                 "lucid_attention_eps": (use_lucid_attention, lucid_attention_eps), "xsa_eps": (use_xsa, xsa_eps)},
        )
        if use_iha:
            self._check_iha(iha_num_pseudo_heads, iha_local_global_pattern, iha_sliding_window)
        self._check_residual_flow(
            use_laurel=use_laurel,
            use_attn_res=use_attn_res,
            use_stack_memory=use_stack_memory,
            use_siamesenorm=use_siamesenorm,
        )
        if use_laurel and not use_laurel_rw and not use_laurel_lr:
            raise ValueError(
                "`use_laurel=True` requires at least one sub-variant to be active: "
                "set `use_laurel_rw=True` and/or `use_laurel_lr=True`."
            )
        if use_laurel and use_laurel_lr and not (1 <= laurel_lr_rank <= hidden_size):
            raise ValueError(
                f"`laurel_lr_rank` must satisfy 1 <= laurel_lr_rank <= hidden_size={hidden_size} when "
                f"`use_laurel_lr=True`, got laurel_lr_rank={laurel_lr_rank}."
            )
        if use_attn_res:
            self._check_attn_res(attn_res_num_blocks, num_hidden_layers)
        if use_stack_memory:
            _check_positive(stack_d_model=stack_d_model, num_mem_heads=num_mem_heads, stack_slots=stack_slots)
            if stack_d_model % num_mem_heads:
                raise ValueError(
                    "`stack_d_model` must be divisible by `num_mem_heads`, "
                    f"got stack_d_model={stack_d_model}, num_mem_heads={num_mem_heads}."
                )
        self._check_layout(
            vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim, max_position_embeddings, partial_rotary_factor,
        )

        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        kwargs = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs}
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

        # Core transformer.
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        # Positions. transformers 5.x reads `rope_parameters`; `rope_scaling` is its (deprecated)
        # alias property, so setting the dict once keeps both names in agreement.
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.rope_parameters = None if rope_scaling is None else dict(rope_scaling)
        if self.rope_parameters is not None:
            self.standardize_rope_params()
            self.validate_rope()
        # Attention.
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.head_dim = head_dim
        self.use_momentum_attention = use_momentum_attention
        self.momentum_gamma = momentum_gamma
        self.use_mea_attention = use_mea_attention
        self.mea_component_key_value_heads = (
            num_key_value_heads if mea_component_key_value_heads is None else int(mea_component_key_value_heads)
        )
        self.mea_groupnorm_eps = mea_groupnorm_eps
        self.use_lucid_attention = use_lucid_attention
        self.lucid_attention_eps = lucid_attention_eps
        self.use_affine_scaled_attention = use_affine_scaled_attention
        self.affine_momentum = affine_momentum
        self.use_xsa = use_xsa
        self.xsa_eps = xsa_eps
        self.use_directional_routing = use_directional_routing
        self.directional_routing_k = directional_routing_k
        self.directional_routing_temp = directional_routing_temp
        # Residual flow over depth.
        self.use_attn_res = use_attn_res
        self.attn_res_num_blocks = attn_res_num_blocks
        self.use_stack_memory = use_stack_memory
        self.stack_d_model = stack_d_model
        self.num_mem_heads = num_mem_heads
        self.stack_slots = stack_slots
        self.stack_memory_cache_size = stack_memory_cache_size
        # FANformer.
        self.use_fan_residual = use_fan_residual
        self.fan_ratio = fan_ratio
        self.fan_ratio_ffn = fan_ratio_ffn
        self.dropout_rate = dropout_rate
        # Learnable multipliers.
        self.use_learnable_multipliers = use_learnable_multipliers
        self.use_embedding_multipliers = use_embedding_multipliers
        # Norms.
        self.use_lns = bool(use_lns)
        self.use_gpas = bool(use_gpas)
        self.use_siamesenorm = bool(use_siamesenorm)
        self.siamese_normalized_input = bool(siamese_normalized_input)
        self.siamese_depth_scaling = bool(siamese_depth_scaling)
        self.siamese_attn_x_scale_init = float(siamese_attn_x_scale_init)
        self.use_embedding_input_norm = use_embedding_input_norm
        # Leviathan generator and JTok-M.
        self.use_token_generator = use_token_generator
        self.generator_d_seed = generator_d_seed
        self.generator_num_modes = generator_num_modes
        self.generator_num_knots = generator_num_knots
        self.generator_spline_degree = generator_spline_degree
        self.generator_k = generator_k
        self.generator_krank = generator_krank
        self.use_jtokm = use_jtokm
        self.jtokm_num_experts = jtokm_num_experts
        self.jtokm_top_k = jtokm_top_k
        self.jtokm_num_modes = jtokm_num_modes
        self.jtokm_aux_loss_weight = jtokm_aux_loss_weight
        self.jtokm_norm_eps = jtokm_norm_eps
        # Output projection, MLP activation, embeddings.
        self.use_hadamard_o_proj = use_hadamard_o_proj
        self.polynorm_exclusive = polynorm_exclusive
        self.use_spelling_bee_embeddings = use_spelling_bee_embeddings
        # Context re-positioning.
        self.use_repo = use_repo
        self.repo_start_layer = repo_start_layer
        self.repo_d_p = repo_d_p
        self.use_repo_grape = use_repo_grape
        self.use_repo_goat_prior = use_repo_goat_prior
        self.repo_goat_num_frequencies = int(repo_goat_num_frequencies)
        self.repo_goat_sink_decay = float(repo_goat_sink_decay)
        # LAUREL.
        self.use_laurel = use_laurel
        self.use_laurel_rw = use_laurel_rw
        self.use_laurel_lr = use_laurel_lr
        self.laurel_lr_rank = laurel_lr_rank
        # Interleaved head attention.
        self.use_iha = use_iha
        self.iha_num_pseudo_heads = iha_num_pseudo_heads
        self.iha_local_global_pattern = iha_local_global_pattern
        self.iha_sliding_window = iha_sliding_window
        self.iha_global_layers_use_iha = bool(iha_global_layers_use_iha)

    # -- the seed's checks, one concern each ---------------------------------------------------
    @staticmethod
    def _resolve_tying(use_token_generator: bool, tie_word_embeddings: bool) -> bool:
        if use_token_generator and tie_word_embeddings:
            logger.warning(
                "`use_token_generator=True` is incompatible with `tie_word_embeddings=True`; setting "
                "`tie_word_embeddings=False`: the generator replaces the lookup table, so the output head "
                "must stay an independent dense projection."
            )
            return False
        return tie_word_embeddings

    @staticmethod
    def _warn_inactive_embedding_multipliers(enabled: bool, learnable: bool, generator: bool, tied: bool) -> None:
        if not enabled:
            return
        if not learnable:
            reason = "`use_learnable_multipliers=False`; no embedding multiplier parameters are created"
        elif generator:
            reason = "`use_token_generator=True` replaces the embedding matrix with the Leviathan generator"
        elif tied:
            reason = "`tie_word_embeddings=True`; multipliers would break input/output parameter sharing"
        else:
            return
        logger.warning("`use_embedding_multipliers=True` is inactive because %s.", reason)

    @staticmethod
    def _check_jtokm(use_jtokm: bool, use_token_generator: bool, top_k: int, num_experts: int) -> None:
        if use_jtokm and not use_token_generator:
            raise ValueError(
                "`use_jtokm=True` requires `use_token_generator=True`: the JTok-M surfaces live on the "
                "generator's latent coordinate z~. Set `use_token_generator=True` or disable JTok-M."
            )
        if use_jtokm and not (1 <= top_k < num_experts):
            raise ValueError(
                "`jtokm_top_k` must satisfy 1 <= jtokm_top_k < jtokm_num_experts, "
                f"got jtokm_top_k={top_k}, jtokm_num_experts={num_experts}."
            )

    @staticmethod
    def _check_generator(k: int, num_knots: int, spline_degree: int, **sizes: int) -> None:
        """The Leviathan generator's sizes (docs/neollm.md#token-generator); the degree is documentation only."""
        if int(k) < 1:
            raise ValueError(f"`generator_k` must be >= 1 (coordinates per token id), got generator_k={k!r}.")
        if int(num_knots) < 2:
            raise ValueError(f"`generator_num_knots` must be >= 2 (knots on [0, 1]), got generator_num_knots={num_knots!r}.")
        _check_positive(**sizes)
        if spline_degree != 2:
            logger.warning(
                "`generator_spline_degree`=%s is documentation only: the generator always uses the closed-form "
                "quadratic (degree 2) basis.", spline_degree,
            )

    @staticmethod
    def _check_jtokm_fields(num_modes: int, norm_eps: float, aux_loss_weight: float) -> None:
        _check_positive(jtokm_num_modes=num_modes)
        if not float(norm_eps) > 0.0:
            raise ValueError(f"`jtokm_norm_eps` must be > 0, got jtokm_norm_eps={norm_eps!r}; the seed default is 1e-6.")
        if not float(aux_loss_weight) >= 0.0:
            raise ValueError(
                f"`jtokm_aux_loss_weight` must be >= 0, got jtokm_aux_loss_weight={aux_loss_weight!r}; the seed default is 1e-4."
            )

    @staticmethod
    def _check_goat(head_dim: int, num_frequencies: int, sink_decay: float) -> None:
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

    @staticmethod
    def _check_attention_options(
        head_dim, mea_component_key_value_heads, affine_momentum, use_directional_routing, directional_routing_k,
        directional_routing_temp, eps,
    ) -> None:
        """MEA heads, the affine EMA momentum, routing's K and τ, and the eps of every enabled option
        (docs/neollm-attention.md#configuration)."""
        if mea_component_key_value_heads is not None and int(mea_component_key_value_heads) < 1:
            raise ValueError(
                f"`mea_component_key_value_heads` must be >= 1, got {mea_component_key_value_heads}; "
                "set a positive head count, or None to use num_key_value_heads."
            )
        if not 0.0 <= float(affine_momentum) < 1.0:
            raise ValueError(f"`affine_momentum` must be in [0, 1), got {affine_momentum}; the seed default is 0.9.")
        if use_directional_routing and not 1 <= int(directional_routing_k) < head_dim:
            raise ValueError(
                f"`directional_routing_k` must satisfy 1 <= k < head_dim={head_dim}, got {directional_routing_k}; "
                f"pick a direction count between 1 and {head_dim - 1}."
            )
        if use_directional_routing and not float(directional_routing_temp) > 0.0:
            raise ValueError(
                f"`directional_routing_temp` must be > 0, got {directional_routing_temp}; the seed default is 3.0."
            )
        for name, (enabled, value) in eps.items():
            if enabled and not float(value) > 0.0:
                raise ValueError(f"`{name}` must be > 0 when its option is on, got {value}; use e.g. 1e-6.")

    @staticmethod
    def _check_iha(num_pseudo_heads: int, pattern: str, window) -> None:
        if num_pseudo_heads < 1:
            raise ValueError(f"`iha_num_pseudo_heads` must be >= 1, got {num_pseudo_heads}.")
        cleaned = str(pattern).upper().strip()
        if not cleaned:
            raise ValueError("`iha_local_global_pattern` must not be empty when `use_iha=True`.")
        bad = sorted(set(cleaned) - {"L", "G"})
        if bad:
            raise ValueError(f"`iha_local_global_pattern` only accepts 'L' and 'G'. Got invalid characters: {bad}.")
        if window is not None and int(window) < 1:
            raise ValueError(f"`iha_sliding_window` must be None (automatic) or an int >= 1, got {window!r}.")

    @staticmethod
    def _check_attn_res(num_blocks: int, num_layers: int) -> None:
        if num_blocks < 0:
            raise ValueError(
                f"`attn_res_num_blocks` must be >= 0 (0 = full AttnRes, one block per layer), got {num_blocks}."
            )
        if num_blocks > num_layers:
            logger.info(
                "`attn_res_num_blocks`=%d exceeds num_hidden_layers=%d; it behaves as %d (one block per layer).",
                num_blocks, num_layers, num_layers,
            )

    @staticmethod
    def _check_residual_flow(**flags: bool) -> None:
        active = [name for name in RESIDUAL_FLOW_FLAGS if flags[name]]
        if len(active) > 1:
            raise ValueError(
                "Enable at most one residual-flow mechanism among `use_laurel`, `use_attn_res`, "
                f"`use_stack_memory`, and `use_siamesenorm`. Active flags: {active}."
            )

    @staticmethod
    def _check_layout(vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos, rotary_factor) -> None:
        _check_positive(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_pos,
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
