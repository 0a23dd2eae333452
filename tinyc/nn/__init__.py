"""Layer 6: neural-network building blocks over Tensor. Submodules: `tinyc.nn.state` (state dicts, safetensors files) and
`tinyc.nn.optim` (SGD, Adam, AdamW, LAMB). Imports tensor and lower layers only.
"""
