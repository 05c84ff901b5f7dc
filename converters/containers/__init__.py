"""Byte-level containers the formats are stored in, parsed as data: LevelDB SSTables and TF1 tensor
bundles, PyTorch zip archives, ONNX protobuf, HDF5 (opened behind a probe), OneFlow's ``flow.save``
folders and their VariableMetaInfo text. They know nothing of BERT."""
