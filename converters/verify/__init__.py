"""Verification: every checkpoint through an independent float64 NumPy BERT (``reference_forward`` on
``reference_np``'s layouts: each codebase's names, orientation and numerics), beside the maker's own
code where installed (``tf_reference*``: Google's model in TensorFlow; ``transformers_run``: HF's
BertModel; onnxruntime for ONNX graphs), compared by ``compare``.
"""
