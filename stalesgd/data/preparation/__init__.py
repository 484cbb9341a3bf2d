"""Readers of local data-set files and the tfds writer behind ``python -m stalesgd.data.prepare``.

* `layouts`: which files make up each accepted input layout, and the error that
  names what is missing when none is complete;
* `cifar10`: CIFAR-10 python (pickled) or binary batches;
* `mnist`: MNIST / Fashion-MNIST IDX files (gzipped or not);
* `imagenet`: an ImageNet ``train/`` + ``val/`` tree of JPEGs, one folder per
  WordNet id;
* `tfds_writer`: writes the examples as the registered tfds data set (ArrayRecord
  shards + ``dataset_info.json`` / ``features.json``) with tfds's own builder,
  without TensorFlow.

Array inputs end up as `stalesgd.data._sources.ArraySource` splits (the npz
layout is read by `stalesgd.data._npz_source`), so every format is checked the
same way before anything is written.
"""

__all__: list[str] = []  # no public names: the machinery of the program stalesgd.data.prepare
