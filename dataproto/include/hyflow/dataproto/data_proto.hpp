#pragma once
// DataProto: the batch that flows between the controller and every worker (verl's
// verl/protocol.py). Tensors share dim 0; per-sample values live in JSON columns; meta_info
// is a JSON object. Copies share tensor storage: in-process transfers never copy data.

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/ordered_dict.hpp>
#include <hyflow/dataproto/tensor_dict.hpp>

#include <ATen/core/Generator.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow {
/// JSON values (nlohmann) in every hyflow API.
using Json = nlohmann::json;
}  // namespace hyflow

namespace hyflow::dataproto {

/// One per-sample value per row: the stand-in for verl's numpy object arrays.
using Column = std::vector<Json>;
/// Ordered name -> column (insertion order is kept, as in a Python dict).
using NonTensorBatch = OrderedDict<Column>;

/// meta_info key that turns on auto-padding for one DataProto (verl's name).
inline constexpr const char* kAutoPaddingKey = "_verl_auto_padding";

/// One sample: row tensors (batch dim removed), per-sample values and shared meta_info.
struct DataProtoItem {
  OrderedDict<at::Tensor> batch;
  OrderedDict<Json> non_tensor_batch;
  Json meta_info = Json::object();
};

/// Rows of one uid value, in order of first appearance (see DataProto::group_indices).
struct IndexGroup {
  Json value;
  std::vector<int64_t> indices;
};

class MiniBatchIterator;

/// Options of DataProto::make_iterator (verl's make_iterator + DataLoader kwargs).
struct MiniBatchOptions {
  int64_t mini_batch_size = 1;
  int64_t epochs = 1;
  bool shuffle = false;
  std::optional<uint64_t> seed;  ///< seeds the shuffle; without it each iterator draws one
};

class DataProto {
 public:
  TensorDict batch;
  NonTensorBatch non_tensor_batch;
  Json meta_info = Json::object();

  DataProto() = default;
  /// Checks consistency (ShapeError naming the key and sizes on mismatch).
  DataProto(TensorDict batch, NonTensorBatch non_tensor_batch = {}, Json meta_info = Json::object());

  /// verl's DataProto.from_dict; auto_padding sets meta_info[kAutoPaddingKey].
  static DataProto from_dict(TensorDict tensors, NonTensorBatch non_tensors = {},
                             Json meta_info = Json::object(), bool auto_padding = false);

  /// Batch size; without tensors the length of the first column; else 0 (verl's __len__).
  int64_t size() const;
  bool empty() const { return size() == 0; }

  /// Throws ShapeError when a tensor or column disagrees with the batch size, or meta_info
  /// is not a JSON object.
  void check_consistency() const;

  /// One sample (negative indices count from the end); IndexError-style ShapeError outside.
  DataProtoItem item(int64_t index) const;
  /// Python slice semantics (negative and missing bounds, step > 0). Shares storage.
  DataProto slice(std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1) const;
  /// Rows by index (negative allowed) or by a bool mask of length size().
  DataProto select_idxs(const std::vector<int64_t>& indices) const;
  DataProto select_idxs(const std::vector<bool>& mask) const;
  /// Integer (any int dtype) or bool tensor, 1-D.
  DataProto select_idxs(const at::Tensor& indices) const;

  /// Keeps only the named keys (nullopt keeps all of that kind). deepcopy clones tensors and
  /// meta_info; otherwise storage is shared.
  DataProto select(const std::optional<std::vector<std::string>>& batch_keys,
                   const std::optional<std::vector<std::string>>& non_tensor_batch_keys = std::nullopt,
                   const std::optional<std::vector<std::string>>& meta_info_keys = std::nullopt,
                   bool deepcopy = false) const;
  /// Removes the named keys from this and returns them (KeyError if one is missing).
  DataProto pop(const std::vector<std::string>& batch_keys,
                const std::vector<std::string>& non_tensor_batch_keys = {},
                const std::vector<std::string>& meta_info_keys = {});
  /// Renames batch keys in place (verl renames tensors only).
  DataProto& rename(const std::vector<std::string>& old_keys, const std::vector<std::string>& new_keys);
  /// verl's union, in place: new keys are added; a key present on both sides must hold
  /// equal values (ValueError naming the key otherwise); batch sizes must match.
  DataProto& union_with(const DataProto& other);

  /// Splits into `chunks` pieces along dim 0 with torch.chunk sizes (ceil(n/chunks) each, so
  /// fewer pieces may come back). Unequal pieces need auto-padding enabled (as in verl).
  std::vector<DataProto> chunk(int64_t chunks) const;
  /// Consecutive pieces of split_size rows; the last may be smaller.
  std::vector<DataProto> split(int64_t split_size) const;
  /// Concatenates along dim 0. meta_info keys other than "metrics" must agree; "metrics"
  /// (a dict or a list of dicts per part) are gathered into a dict of lists. Parts that are
  /// consecutive views of one tensor (chunk/split output) are joined without copying, so the
  /// result shares their storage, as slice does; other parts are copied once.
  static DataProto concat(const std::vector<DataProto>& parts);

  /// Permutes rows in place: row i becomes old row indices[i].
  DataProto& reorder(const at::Tensor& indices);
  DataProto& reorder(const std::vector<int64_t>& indices);
  /// interleave: a,a,b,b; otherwise tiled: a,b,a,b.
  DataProto repeat(int64_t repeat_times = 2, bool interleave = true) const;
  /// Row i repeated repeat_times[i] times, interleaved.
  DataProto sample_level_repeat(const std::vector<int64_t>& repeat_times) const;

  /// Auto-padding flag in meta_info (DP_COMPUTE_PROTO pads when it is set).
  bool is_padding_enabled() const;
  /// In place: appends padding_size copies of the last row ("first": the first row).
  DataProto& padding(int64_t padding_size, std::string_view padding_candidate = "");

  /// Moves tensors to a device, in place (verl's to()).
  DataProto& to(const at::Device& device);

  /// Row indices grouped by the values of a non-tensor column (e.g. "uid"), groups in order
  /// of first appearance. Rows need not be contiguous.
  std::vector<IndexGroup> group_indices(std::string_view column) const;

  /// Mini-batches over `epochs` passes (verl's make_iterator). size() must be a multiple of
  /// mini_batch_size. Deterministic for a given seed.
  MiniBatchIterator make_iterator(const MiniBatchOptions& options) const;

  /// A one-line summary: sizes, keys, dtypes and shapes (verl's get_data_info).
  std::string info() const;
};

/// verl's collate_fn: stacks items back into a DataProto (meta_info from the first).
DataProto collate(const std::vector<DataProtoItem>& items);

/// verl's pad_dataproto_to_divisor: appends rows taken cyclically from the START until size()
/// is a multiple of divisor. Returns the padded batch and the number of rows added.
std::pair<DataProto, int64_t> pad_dataproto_to_divisor(const DataProto& data, int64_t divisor);
/// Drops the last pad_size rows (verl's unpad_dataproto).
DataProto unpad_dataproto(const DataProto& data, int64_t pad_size);

/// Lazily yields mini-batches; see DataProto::make_iterator.
class MiniBatchIterator {
 public:
  MiniBatchIterator(DataProto data, MiniBatchOptions options);
  /// The next mini-batch, or nullopt after the last epoch.
  std::optional<DataProto> next();
  /// Mini-batches per epoch.
  int64_t batches_per_epoch() const;

 private:
  void start_epoch();
  DataProto data_;
  MiniBatchOptions options_;
  std::optional<at::Generator> generator_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
};

}  // namespace hyflow::dataproto

namespace hyflow {
// verl's names (verl.protocol) where verl users write them.
using dataproto::collate;
using dataproto::DataProto;
using dataproto::DataProtoItem;
using dataproto::kAutoPaddingKey;
using dataproto::pad_dataproto_to_divisor;
using dataproto::unpad_dataproto;
}  // namespace hyflow
