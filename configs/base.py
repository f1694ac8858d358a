"""Defaults of every setting; experiment files override a few and add presets.

Each field has a one-line meaning. A field added later must default to the behaviour the
code had without it: a run recorded before it existed resumes only where it holds this
default (`sgs_jax.config.config_diff`). Presets:
  testbed  the embedded propositional domain, the packaged tiny models, CPU, minutes (the README's main job)
  paper    DeepSeek-Prover-V2-7B on D3k with the Lean backend, the paper's constants
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.experiment = "sgs"  # name written to logs

    c.run = ConfigDict()
    c.run.workdir = "runs/sgs"  # logs, resolved config, checkpoints and state go here
    c.run.seed = 0  # master seed: sampling keys, shuffles
    c.run.iterations = 500  # SGS iterations (Algorithm 1 steps)
    c.run.checkpoint_every = 1  # save model and loop state every N iterations (resume point)
    c.run.keep_checkpoints = 2  # newest checkpoints kept on disk (>= 1; an older one is the fallback for a damaged newest)
    c.run.log_examples = 4  # kept conjectures and verified proofs (each) written to examples.jsonl per iteration (0 = none)
    c.run.compile_cache_dir = ""  # JAX persistent compilation cache ("" = <workdir>/compile_cache, "off" = none): a resumed run loads its compiled programs
    c.run.base_solve_rate = True  # step 0 logs base_solve_rate: the base Solver's pass@k on the targets (own seed; not trained on, not counted)
    c.run.export_every = 0  # export the Solver as a Hugging Face checkpoint to exports/solver_iteration_N every N iterations (0 = off)

    c.targets = ConfigDict()
    c.targets.source = "testbed"  # testbed | file | hub
    c.targets.path = ""  # D3k-format JSON when source=file
    c.targets.hub_id = "LukeBailey181Pub/D_3k"  # dataset when source=hub
    c.targets.limit = 0  # use only the first N targets (0 = all)
    c.targets.max_proofs = 16  # verified proofs kept per target

    c.model = ConfigDict()
    c.model.checkpoint = ""  # HF checkpoint dir/hub id of the base prover (Solver and Conjecturer start here)
    c.model.guide_checkpoint = ""  # HF checkpoint of a ready Guide ("" = fine-tune the base on guide.sft_data)
    c.model.dtype = "float32"  # compute dtype
    c.model.param_dtype = "float32"  # stored parameter dtype
    c.model.remat_policy = "none"  # none | full | dots | offload (per-layer rematerialisation in training; never in sampling; offload = full with the saved layer inputs in host memory)
    c.model.attention = "auto"  # attention backend: auto (per platform) | native (CPU C++ kernels) | blockwise (CPU, plain JAX) | xla | cudnn (GPU) | splash (TPU Pallas)
    c.model.layer_loop = "auto"  # training's layers: scan (one lax.scan, a program the same size at any depth) | unrolled (faster on XLA:CPU) | auto (unrolled on one CPU device, else scan)
    c.model.parameter_sharing = False  # Solver and Conjecturer share one set of weights

    c.mesh = ConfigDict()
    c.mesh.data = 1  # data-parallel axis size
    c.mesh.fsdp = -1  # FSDP axis size (-1 = all remaining devices)
    c.mesh.tensor = 1  # tensor-parallel axis size

    c.sampling = ConfigDict()
    c.sampling.temperature = 1.0  # all roles (method.md §2)
    c.sampling.top_p = 1.0  # nucleus threshold (1.0 = off)
    c.sampling.top_k = 0  # 0 = off
    c.sampling.solver_max_total_len = 8192  # Solver prompt + generation cap, tokens
    c.sampling.conjecturer_max_new_tokens = 8192  # Conjecturer generation cap
    c.sampling.guide_max_new_tokens = 8192  # Guide generation cap
    c.sampling.max_batch = 256  # concurrent sequences (slots) in the sampler
    c.sampling.kv_pool_tokens = 524_288  # KV pool capacity in tokens, shared by all slots (a full pool pauses refills)
    c.sampling.page_size = 64  # tokens per KV page (rows take pages as they grow; the k samples share prompt pages)
    c.sampling.paged_attention = "auto"  # decode attention over the KV pages: auto (Pallas on TPU/GPU; on CPU the native C++ kernel where a compiler is found, else gather) | native | gather | pallas_tpu | pallas_gpu
    c.sampling.weights_dtype = "bfloat16"  # dtype of the weights every role samples with (trainers keep model.param_dtype masters)
    c.sampling.weights_layout = "inference"  # inference (replicated over data/fsdp, heads/MLP/vocab over tensor: no weight all-gather in decode) | training (the trainers' FSDP layout)
    c.sampling.keep_inference_weights = False  # keep a trainer's sampling copy until it steps (else released after each sampling phase)

    c.roles = ConfigDict()
    c.roles.offload_idle = False  # park the weights / optimizer states a phase does not use in pinned host memory
    c.roles.placement = "shared"  # shared (all roles time-sliced on one mesh) | split (the Guide and/or the Conjecturer on devices of their own, overlapping the Solver's training)
    c.roles.guide_devices = 0  # split: devices of the Guide's sub-mesh (data x tensor, mesh.tensor wide; the same number from every process); 0: the Guide shares the Solver's mesh
    c.roles.conjecturer_devices = 0  # split: devices of the Conjecturer's sub-mesh (its trainer, fsdp x tensor, and its sampler; the same number from every process); 0: it shares the Solver's mesh

    c.sgs = ConfigDict()
    c.sgs.use_conjecturer = True  # False = Solver-only RL baselines
    c.sgs.train_conjecturer = True  # False = frozen base Conjecturer
    c.sgs.condition_on_target = True  # False = No Problem Conditioning ablation
    c.sgs.use_guide = True  # False = R_guide = 1 (No Guide)
    c.sgs.conjectures_per_target = 1  # Conjecturer samples per unsolved target
    c.sgs.proofs_per_problem = 8  # k Solver samples per target and conjecture
    c.sgs.keep_quantile = 0.7  # p70 rule: keep 0 < s <= sorted(rates in (0,1))[floor(q n)]; q in (0, 1)
    c.sgs.solver_objective = "reinforce_half"  # reinforce_half | cispo | expert_iteration
    c.sgs.token_aware_try = False  # False = plain substring `try` ban (official); True = token-aware
    c.sgs.ei_buffer_iterations = 3  # Expert Iteration: iterations of proofs kept in the buffer
    c.sgs.check_conjecture_statement = False  # elaborate each conjecture with `sorry` first; drop (and count) ill-formed ones (off: paper)

    c.solver_train = _optimizer_defaults(lr=3e-6, batch_size=32)  # Solver optimiser
    c.conjecturer_train = _optimizer_defaults(lr=3e-6, batch_size=32)  # Conjecturer optimiser
    c.cispo = ConfigDict()
    c.cispo.eps_low = 1.0  # importance weight clipped below at 1 - eps_low
    c.cispo.eps_high = 3.0  # and above at 1 + eps_high
    c.cispo.normalization = "batch_tokens"  # batch_tokens (paper) | group_tokens (official code)

    c.prompts = ConfigDict()  # template file per role; "" = the packaged template (sgs_jax/sgs/templates)
    c.prompts.solver = ""  # Solver prompt (DeepSeek-Prover-V2 format)
    c.prompts.conjecturer = ""  # Conjecturer prompt showing the target
    c.prompts.conjecturer_no_target = ""  # Conjecturer prompt of the No Problem Conditioning ablation
    c.prompts.guide = ""  # Guide rubric prompt

    c.verify = ConfigDict()
    c.verify.backend = "prop"  # prop (testbed) | lean (local REPL pool) | remote (Kimina server)
    c.verify.options = ConfigDict()  # backend keyword options (workers, timeout_s, repl_cmd, url, ...)
    c.verify.cache = True  # persist verdicts with the run; a resumed run keeps them

    c.guide = ConfigDict()
    c.guide.sft_data = ""  # JSONL of (prompt, completion) rubric replies for Guide fine-tuning
    c.guide.sft_epochs = 2  # passes over it
    c.guide.sft_lr = 1e-5  # learning rate
    c.guide.sft_batch_size = 32  # sequences per optimiser step
    c.guide.sft_micro_batch_size = 4  # sequences per micro-batch
    c.guide.shadow_score = False  # without the Guide (sgs.use_guide False): load it anyway, log its scores as guide_shadow/*, never reward them
    return c


def _optimizer_defaults(lr: float, batch_size: int) -> ConfigDict:
    o = ConfigDict()
    o.lr = lr  # constant learning rate
    o.batch_size = batch_size  # sequences per optimiser step
    o.micro_batch_size = 8  # sequences per micro-batch (gradient accumulation); a multiple of mesh data x fsdp
    o.min_bucket = 64  # shortest micro-batch length; lengths step x1.5 / x2 up to the role's max (one program each)
    o.pack_length = 0  # 0: one sequence per row; > 0: rows of up to this many tokens (>= the role's longest sequence) hold several sequences side by side, little padding
    o.b1 = 0.9  # Adam beta1
    o.b2 = 0.95  # Adam beta2
    o.eps = 1e-8  # Adam epsilon
    o.clip_norm = 1.0  # global gradient-norm clip
    o.reset_optimizer = True  # fresh optimiser state every iteration
    o.normalization = "batch_tokens"  # batch_tokens (official code) | sequence (paper Eq. 4); CISPO: cispo.normalization
    return o
