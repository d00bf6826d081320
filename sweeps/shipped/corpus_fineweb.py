"""The mixers on a corpus larger than Wikitext-2: FineWeb-Edu's 10B-token sample, streamed
from the Hugging Face hub, in GPT-2's BPE ids, 2.5B training tokens a run (a cluster job).

A GPT-2-small-sized backbone (12 layers, d_model 768, d_ff 3072, pre-LN, L = 1024, global
batch 256 sequences = 262,144 tokens a step, AdamW at 6e-4 with 700 warm-up steps, bf16
autocast on the GPUs) around attention, and the Grassmann mixer, Mamba-2 and Gated
DeltaNet resized along d_model to attention's parameter count without embeddings (2%),
one seed each. Validation and test are held out of the stream (1 in 1,000 documents,
2M tokens each). The first job to start tokenizes the training stream (about 5 GB of
uint16 ids) under $LINBENCH_CACHE while the others wait on its lock: put that cache on a
file system every node reads. Each run trains on 16 GPUs (2 nodes of 8), each GPU on 16
sequences a step:

    LINBENCH_CACHE=/shared/linbench-cache linbench run corpus_fineweb --executor slurm \\
        --partition gpu --gpus 8 --tasks-per-node 8 --nodes 2 --cpus-per-task 8 --time 720

Not run here (no GPU, no hub on the machine this is built on): not measured on GPU.
"""
import zoo
from sweeps import RunConfig, matched_models
from tasks.corpus import CorpusConfig
from tasks.engine.train import TrainConfig

SEQ = 1024
BASE = zoo.ModelConfig(vocab_size=50257, d_model=768, n_layers=12, d_ff=3072, max_len=SEQ, mixer="attention",
                       mixer_options={"n_heads": 12}, block="prenorm", positions="learned")
PEERS = {"attention": ("attention", {"n_heads": 12}), "grassmann": ("grassmann", {}),
         "mamba2": ("mamba2", {}), "gated_deltanet": ("gated_deltanet", {})}
TRAIN = TrainConfig(batch_size=256, micro_batch_size=16, lr=6e-4, warmup_steps=700, weight_decay=0.1)

configs = []
for label, model in matched_models(BASE, PEERS, knob="d_model").items():
    positions = "learned" if zoo.mixer_class(model.mixer).needs_positions else "none"
    cfg = CorpusConfig(source="hf:HuggingFaceFW/fineweb-edu:sample-10BT", holdout=0.001,
                       tokenizer="hub:gpt2", max_train_tokens=2_500_000_000, max_eval_tokens=2_000_000,
                       seq_len=SEQ, budget_tokens=2_500_000_000, eval_every_tokens=250_000_000,
                       model=model.replace(positions=positions), train=TRAIN)
    configs.append(RunConfig("corpus", cfg, label=label))
