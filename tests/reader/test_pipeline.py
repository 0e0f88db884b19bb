"""The input pipeline: decode, class ids, one-hot, normalization, resampling, shuffling,
determinism and decode-error policies, over a real uploaded dataset read locally."""
from __future__ import annotations

import io
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sample_data import make_image_list

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LabelOptions,
    LocalSource,
    PipelineOptions,
    SamplingOptions,
    dist,
)
from trainfeed.decode.pixels import DecodeError
from trainfeed.io.prefetch import EXIT_JOIN_S
from trainfeed.reader.reader import Reader
from trainfeed.reader.resample import ratio_factors
from trainfeed.upload import UploadOptions, upload

# Its tests make readers in expressions (`list(dist.reader(...)())`): each is closed at the
# test's end, its decoder's threads with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("close_readers")
N = 120
LABELS = ("cat", "dog", "bird")  # record i has LABELS[i % 3]; class ids: bird 0, cat 1, dog 2


@pytest.fixture
def storage(tmp_path: Path) -> str:
    source = make_image_list(tmp_path / "source", N, labels=LABELS)
    out = str(tmp_path / "storage")
    upload(str(source), "flowers", out, UploadOptions(row_group_rows=8), progress=False)
    return out


def pixels(source: Path, record: int) -> np.ndarray:
    return np.asarray(Image.open(source / "images" / f"{record:05d}.jpg").convert("RGB"))


def one_epoch(reader: Reader) -> list[dict[str, np.ndarray]]:
    return list(reader())


def test_batches_hold_decoded_normalized_images_and_one_hot_labels(storage: str,
                                                                   tmp_path: Path) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True,
                                                                       normalizing_const=255.0),
                                                  labels=LabelOptions(one_hot=True),
                                                  batch=BatchOptions(size=16)))
    spec = reader.output_spec()
    assert spec["image"] == ((None, None, None, 3), np.dtype(np.float32))
    assert spec["label"] == ((None, 3), np.dtype(np.float32))
    batches = one_epoch(reader)
    assert [len(b["_id"]) for b in batches] == [16] * 7 + [8]
    ids = np.concatenate([b["_id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(N))
    for b in batches:
        assert b["image"].dtype == np.float32 and b["image"].shape[1:] == (16, 16, 3)
        assert b["label"].dtype == np.float32 and (b["label"].sum(axis=1) == 1).all()
        for row, record in enumerate(b["_id"].tolist()):
            expected = sorted(LABELS).index(LABELS[record % 3])
            assert b["label"][row].argmax() == expected
            # simplejpeg and Pillow are both libjpeg-turbo: at most rounding apart
            want = pixels(tmp_path / "source", record) / 255.0
            assert np.abs(b["image"][row] - want).max() <= 2 / 255


def test_resize_uint8_class_ids_and_the_tuple_stream(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 12)),
                                                  batch=BatchOptions(size=32)))
    assert reader.output_spec()["image"] == ((None, 8, 12, 3), np.dtype(np.uint8))
    batch = next(iter(reader()))
    assert batch["image"].shape == (32, 8, 12, 3) and batch["image"].dtype == np.uint8
    assert batch["label"].dtype == np.int64 and set(batch["label"].tolist()) <= {0, 1, 2}
    instances = list(dist.reader("flowers", source=LocalSource(storage=storage),
                                 pipeline=PipelineOptions(
                                     decode=DecodeOptions(True, image_size=(8, 8))))())
    assert len(instances) == N
    image, label = instances[0]
    assert image.shape == (8, 8, 3) and label in (0, 1, 2)


def test_same_seed_same_batches_other_epochs_and_seeds_differ(storage: str) -> None:
    def order(seed: int, epochs: int = 2) -> list[list[int]]:
        reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=seed),
                             pipeline=PipelineOptions(decode=DecodeOptions(True),
                                                      batch=BatchOptions(size=10),
                                                      sampling=SamplingOptions(shuffle_buffer=40)))
        return [np.concatenate([b["_id"] for b in reader()]).tolist() for _ in range(epochs)]
    first = order(seed=1)
    assert first == order(seed=1)
    assert first[0] != first[1] and sorted(first[0]) == sorted(first[1]) == list(range(N))
    assert order(seed=2)[0] != first[0]


def test_the_shuffle_buffer_mixes_records_across_partitions(storage: str) -> None:
    plain = dist.reader("flowers", source=LocalSource(storage=storage),
                        pipeline=PipelineOptions(decode=DecodeOptions(True),
                                                 batch=BatchOptions(size=8)))
    mixed = dist.reader("flowers", source=LocalSource(storage=storage),
                        pipeline=PipelineOptions(decode=DecodeOptions(True),
                                                 batch=BatchOptions(size=8),
                                                 sampling=SamplingOptions(shuffle_buffer=64)))
    # Without a buffer a batch is one partition (8 rows each): consecutive record ids.
    for b in plain():
        assert np.ptp(b["_id"]) == 7
    spread = [np.ptp(b["_id"]) for b in mixed()]
    assert np.mean(spread) > 30


def imbalanced(tmp_path: Path, n: int, classes: int) -> tuple[str, Counter[str]]:
    """Class k gets weight 2^-k: record i's label drawn with those odds (fixed seed)."""
    source = make_image_list(tmp_path / "imb", n, size=8)
    weights = np.array([2.0 ** -k for k in range(classes)])
    labels = np.random.default_rng(7).choice(classes, size=n, p=weights / weights.sum())
    lines = source.read_text().splitlines()
    source.write_text("".join(f"{line.split(chr(9))[0]}\tc{k}\n"
                              for line, k in zip(lines, labels)))
    out = str(tmp_path / "imb-storage")
    upload(str(source), "imbalanced", out, UploadOptions(row_group_rows=16), progress=False)
    return out, Counter(f"c{k}" for k in labels)


def test_resampling_to_uniform_matches_within_four_sigma(tmp_path: Path) -> None:
    storage, histogram = imbalanced(tmp_path, 1500, classes=5)
    factors = ratio_factors(histogram, "uniform")
    epochs = 4
    reader = dist.reader("imbalanced", source=LocalSource(storage=storage, seed=3),
                         pipeline=PipelineOptions(sampling=SamplingOptions(resample="uniform"),
                                                  batch=BatchOptions(size=64)))
    got: Counter[int] = Counter()
    for _ in range(epochs):
        for b in reader():
            got.update(b["label"].tolist())
    classes = sorted(histogram)
    for k, name in enumerate(classes):
        n_k, p = histogram[name], factors[name]
        expected = epochs * n_k * p  # = epochs * 1500 / 5
        frac = p - np.floor(p)
        sigma = np.sqrt(epochs * n_k * frac * (1 - frac))
        # Tolerance: 4 standard deviations of the sum of Bernoulli(frac) draws (+1 for rounding).
        assert abs(got[k] - expected) <= 4 * sigma + 1, (name, got[k], expected, sigma)
    print({classes[k]: got[k] for k in range(len(classes))}, "expected each",
          epochs * 1500 / 5)
    # Validation never resamples: every record exactly once.
    val = dist.reader("imbalanced", source=LocalSource(storage=storage),
                      pipeline=PipelineOptions(sampling=SamplingOptions(resample="uniform"),
                                               batch=BatchOptions(size=64), mode="validation"))
    assert sorted(np.concatenate([b["_id"] for b in val()]).tolist()) == list(range(1500))


def test_over_sampled_copies_do_not_sit_together(tmp_path: Path) -> None:
    storage, _ = imbalanced(tmp_path, 400, classes=4)
    reader = dist.reader("imbalanced", source=LocalSource(storage=storage, seed=1),
                         pipeline=PipelineOptions(sampling=SamplingOptions(resample="uniform",
                                                                           shuffle_buffer=200),
                                                  batch=BatchOptions(size=32)))
    ids = np.concatenate([b["_id"] for b in reader()])
    adjacent = int((ids[1:] == ids[:-1]).sum())
    repeats = len(ids) - len(set(ids.tolist()))
    assert repeats > 50 and adjacent < repeats / 10


def test_decode_errors_raise_with_the_record_and_shard_or_are_skipped(tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "bad", 40)
    (tmp_path / "bad" / "images" / "00013.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    storage = str(tmp_path / "storage")
    upload(str(source), "bad", storage, UploadOptions(row_group_rows=8), progress=False)
    strict = dist.reader("bad", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True),
                                                  batch=BatchOptions(size=8)))
    with pytest.raises(DecodeError, match=r"record 13 \(images/00013\.jpg, train_data\.list "
                                          r"line 14\) of shard \S+\.parquet: cannot decode"):
        list(strict())
    lenient = dist.reader("bad", source=LocalSource(storage=storage),
                          pipeline=PipelineOptions(decode=DecodeOptions(True, errors="skip"),
                                                   batch=BatchOptions(size=8)))
    ids = np.concatenate([b["_id"] for b in lenient()]).tolist()
    assert sorted(ids) == [i for i in range(40) if i != 13]
    assert lenient.decode_failures == 1


def test_png_goes_through_pillow(tmp_path: Path) -> None:
    folder = tmp_path / "png"
    (folder / "images").mkdir(parents=True)
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    (folder / "images" / "a.png").write_bytes(buf.getvalue())
    (folder / "train_data.list").write_text("images/a.png\tx\n")
    storage = str(tmp_path / "storage")
    upload(str(folder / "train_data.list"), "png", storage, progress=False)
    [(decoded, label)] = list(dist.reader("png", source=LocalSource(storage=storage),
                                          pipeline=PipelineOptions(decode=DecodeOptions(True)))())
    assert (decoded == image).all() and label == 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="pass decode=True"):
        dist.reader("x", source=LocalSource(),
                    pipeline=PipelineOptions(decode=DecodeOptions(image_size=(8, 8))))
    with pytest.raises(ValueError, match=r"mode is .predict. \(str\), expected one of"):
        dist.reader("x", source=LocalSource(), pipeline=PipelineOptions(mode="predict"))
    with pytest.raises(ValueError, match=r"decode_errors is .ignore. \(str\), expected one of"):
        dist.reader("x", source=LocalSource(),
                    pipeline=PipelineOptions(decode=DecodeOptions(True, errors="ignore")))


def test_under_sampled_records_cost_no_payload_io(tmp_path: Path) -> None:
    """The label column is read first and only kept records' payloads are fetched (by byte
    range): payload bytes read per epoch = the bytes of the distinct records delivered."""
    storage, histogram = imbalanced(tmp_path, 800, classes=5)
    lines = (tmp_path / "imb" / "train_data.list").read_text().splitlines()
    sizes = np.array([(tmp_path / "imb" / line.split("\t")[0]).stat().st_size for line in lines])
    reader = dist.reader("imbalanced", source=LocalSource(storage=storage, seed=5),
                         pipeline=PipelineOptions(sampling=SamplingOptions(resample="uniform"),
                                                  batch=BatchOptions(size=64)))
    for _ in range(2):
        before = reader.payload_bytes_read
        ids = np.concatenate([b["_id"] for b in reader()])
        fetched = reader.payload_bytes_read - before
        survivors = np.unique(ids)
        assert fetched == sizes[survivors].sum()
        kept = len(survivors) / len(sizes)
        print(f"kept {kept:.0%} of the records, read {fetched / sizes.sum():.0%} of the payload")
        assert kept < 0.8  # the dominant class was under-sampled: the test means something
    plain = dist.reader("imbalanced", source=LocalSource(storage=storage),
                        pipeline=PipelineOptions(batch=BatchOptions(size=64)))
    list(plain())
    assert plain.payload_bytes_read == sizes.sum()  # without resampling: every payload


def test_class_weights_give_each_class_the_same_total_loss_weight(tmp_path: Path) -> None:
    storage, histogram = imbalanced(tmp_path, 600, classes=4)
    reader = dist.reader("imbalanced", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=50),
                                                  labels=LabelOptions(class_weights="uniform")))
    assert reader.output_spec()["_weight"] == ((None,), np.dtype(np.float32))
    totals: Counter[int] = Counter()
    records = 0
    for b in reader():
        records += len(b["_id"])
        for label, weight in zip(b["label"].tolist(), b["_weight"].tolist()):
            totals[label] += weight
    assert records == 600  # weighting drops and repeats nothing
    assert np.allclose(list(totals.values()), 600 / 4, rtol=1e-4), totals


def test_crop_keeps_the_centre_without_stretching(tmp_path: Path) -> None:
    folder = tmp_path / "wide"
    (folder / "images").mkdir(parents=True)
    image = np.zeros((10, 30, 3), dtype=np.uint8)
    image[:, 10:20] = 255  # a white centre square between black side bands
    Image.fromarray(image).save(folder / "images" / "a.png")
    (folder / "train_data.list").write_text("images/a.png\tx\n")
    storage = str(tmp_path / "storage")
    upload(str(folder / "train_data.list"), "wide", storage, progress=False)
    [(cropped, _)] = list(dist.reader("wide", source=LocalSource(storage=storage),
                                      pipeline=PipelineOptions(decode=DecodeOptions(
                                          True, image_size=(5, 5), crop=True)))())
    [(stretched, _)] = list(dist.reader("wide", source=LocalSource(storage=storage),
                                        pipeline=PipelineOptions(decode=DecodeOptions(
                                            True, image_size=(5, 5))))())
    assert cropped.shape == stretched.shape == (5, 5, 3)
    assert (cropped == 255).all()  # only the centre square is left
    assert stretched[:, 0].max() == 0  # the stretched one still has the black band


def test_a_validation_set_lacking_classes_uses_the_training_class_ids(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    train = make_image_list(tmp_path / "train", 12, labels=("ant", "bee", "cat", "dog"))
    val = make_image_list(tmp_path / "val", 6, labels=("bee", "dog"), seed=1)
    upload(str(train), "train", storage, progress=False)
    upload(str(val), "val", storage, progress=False)
    training = dist.reader("train", source=LocalSource(storage=storage),
                           pipeline=PipelineOptions(labels=LabelOptions(one_hot=True),
                                                    batch=BatchOptions(size=4)))
    assert training.class_values == ("ant", "bee", "cat", "dog")
    own = dist.reader("val", source=LocalSource(storage=storage),
                      pipeline=PipelineOptions(batch=BatchOptions(size=6)))
    shared = dist.reader("val", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(
                             batch=BatchOptions(size=6), mode="validation",
                             labels=LabelOptions(True, class_values=training.class_values)))
    [b_own], [b_shared] = list(own()), list(shared())
    order = np.argsort(b_shared["_id"])
    assert b_shared["label"][order].argmax(axis=1).tolist() == [1, 3] * 3  # bee 1, dog 3
    assert sorted(set(b_own["label"].tolist())) == [0, 1]  # on its own: bee 0, dog 1
    # A pin that lacks a label of the dataset is refused before a record (issue 38).
    with pytest.raises(ValueError, match=r"label\(s\) \['dog'\] outside the reader's "
                                         r"class_values: pinned \{0: 'ant', 1: 'bee'\}"):
        list(dist.reader("val", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(
                             batch=BatchOptions(size=6),
                             labels=LabelOptions(class_values=["ant", "bee"])))())


def mixed_sizes(tmp_path: Path, n: int, broken: int | None = None) -> str:
    """Record i is a JPEG of (16 + 4 * (i % 3)) x 20 pixels, as stored; `broken` not a JPEG."""
    folder = tmp_path / "mixed"
    (folder / "images").mkdir(parents=True)
    lines = []
    for i in range(n):
        rel = f"images/{i:05d}.jpg"
        if i == broken:
            (folder / rel).write_bytes(b"\xff\xd8 not really a jpeg")
        else:
            Image.fromarray(np.full((16 + 4 * (i % 3), 20, 3), i, np.uint8)).save(folder / rel)
        lines.append(f"{rel}\t{LABELS[i % 3]}\n")
    (folder / "train_data.list").write_text("".join(lines))
    storage = str(tmp_path / "mixed-storage")
    upload(str(folder / "train_data.list"), "mixed", storage, UploadOptions(row_group_rows=8),
           progress=False)
    return storage


def test_images_of_mixed_sizes_read_one_at_a_time_as_stored(tmp_path: Path) -> None:
    """Issue 38 papercut 5: "None: as stored", "one decoded tuple at a time": each record its
    own size, normalized, a failed one skipped; a batch of them names the option to set."""
    storage = mixed_sizes(tmp_path, 30, broken=7)
    reader = dist.reader("mixed", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(
                             True, normalizing_const=255.0, errors="skip")))
    shapes = {}
    for image, _label in reader():  # record i's pixels are all i (JPEG keeps a flat colour)
        assert image.dtype == np.float32
        shapes[int(round(float(image.mean()) * 255))] = image.shape
    assert sorted(shapes) == [i for i in range(30) if i != 7]
    assert all(shape == (16 + 4 * (i % 3), 20, 3) for i, shape in shapes.items())
    batched = dist.reader("mixed", source=LocalSource(storage=storage),
                          pipeline=PipelineOptions(decode=DecodeOptions(True, errors="skip"),
                                                   batch=BatchOptions(size=8)))
    with pytest.raises(DecodeError, match=r"different shapes .*image_size=\(height, width\)"):
        list(batched())


def _trainfeed_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("trainfeed-") and t.is_alive()}


@pytest.fixture
def long_pass(tmp_path: Path) -> str:
    """A pass far longer than its threads buffer (1,024 tiny images: 64 batches of 16, 16
    pieces of instances; at most 7 are in its threads and queues at once), so that every one
    of them is still at work after its first batch."""
    source = make_image_list(tmp_path / "source", 1024, labels=LABELS, size=4)
    out = str(tmp_path / "storage")
    upload(str(source), "flowers", out, UploadOptions(row_group_rows=8), progress=False)
    return out


@pytest.mark.parametrize("size", [16, None], ids=["batches", "instances"])
def test_a_reader_closed_mid_epoch_leaves_no_thread_running(long_pass: str,
                                                            size: int | None) -> None:
    """`close()` ends a pass the trainer still holds: its read-ahead, batch preparation,
    cutting, converting and decoding threads are gone once it returned. Before, they ran until
    the pass's iterator was collected (and the preparation thread for good while the trainer
    held it), which CI's thread check reported after tests/reader/test_resume.py."""
    before = _trainfeed_threads()
    with dist.reader("flowers", source=LocalSource(storage=long_pass),
                     pipeline=PipelineOptions(decode=DecodeOptions(True, threads=2),
                                              batch=BatchOptions(size=size,
                                                                 prefetch=2))) as reader:
        batches = reader()  # held: only close() can end it
        next(batches)
        started = {t.name.rstrip("_0123456789") for t in _trainfeed_threads() - before}
        assert {"trainfeed-pipeline", "trainfeed-cut", "trainfeed-convert",
                "trainfeed-decode"} <= started  # (a batch of 16 decodes on the pool)
        reader.close()
        # Every thread was joined by close() (each join bounded by the 30 s of
        # Background.close), but the decoders' idle ones, which it woke to end: they get as
        # long as a process gives its read-ahead threads at exit.
        joined = {t.name for t in _trainfeed_threads() - before
                  if not t.name.startswith("trainfeed-decode")}
        assert not joined, sorted(joined)
        deadline = time.monotonic() + EXIT_JOIN_S
        while (left := _trainfeed_threads() - before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, sorted(t.name for t in left)
        with pytest.raises(StopIteration):  # the pass is over
            next(batches)
