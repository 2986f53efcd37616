"""The EAGLE-3 drafter: the model, its checkpoint formats, drafting at every position, SGLang's
tree building."""
