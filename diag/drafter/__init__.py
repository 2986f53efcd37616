"""The EAGLE-3 drafter: the model (model.py, with GQA attention.py or DeepSeek MLA mla.py), its
config as the engine reads it (config.py), its checkpoints read strictly headers first
(checkpoint.py) and written (save.py), drafting at every position, SGLang's tree building."""
