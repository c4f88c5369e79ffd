#include <hyflow/dataproto/data_proto.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <unordered_map>

namespace hyflow::dataproto {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

at::Tensor index_tensor(const std::vector<int64_t>& indices) {
  return at::tensor(at::ArrayRef<int64_t>(indices), at::TensorOptions().dtype(at::kLong));
}

/// Python's index normalisation: negative counts from the end; ShapeError outside.
int64_t normalize_index(int64_t index, int64_t size, const char* op) {
  const int64_t i = index < 0 ? index + size : index;
  if (i < 0 || i >= size)
    throw ShapeError(std::string("DataProto::") + op + ": index " + str(index) +
                     " out of range for size " + str(size));
  return i;
}

Column take(const Column& column, const std::vector<int64_t>& indices) {
  Column out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(column[static_cast<size_t>(i)]);
  return out;
}

Column take_range(const Column& column, int64_t start, int64_t end) {
  return Column(column.begin() + start, column.begin() + end);
}

/// Deep equality where NaN equals NaN (verl's union_numpy_dict semantics).
bool json_equal_nan(const Json& a, const Json& b) {
  if (a.is_number_float() && b.is_number_float()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || (std::isnan(x) && std::isnan(y));
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal_nan(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto jt = b.find(it.key());
      if (jt == b.end() || !json_equal_nan(*it, *jt)) return false;
    }
    return true;
  }
  return a == b;
}

bool tensors_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         a.device() == b.device() && at::equal(a, b);
}

/// True when the pieces are consecutive row ranges of one tensor (as chunk/split make them):
/// same storage, dtype and strides, each starting where the previous one ends.
bool adjacent_views(const std::vector<at::Tensor>& pieces) {
  const at::Tensor& first = pieces.front();
  if (!first.has_storage()) return false;
  int64_t next_offset = first.storage_offset();
  for (const auto& p : pieces) {
    if (!p.has_storage() || !p.storage().is_alias_of(first.storage()) || p.scalar_type() != first.scalar_type() ||
        p.strides() != first.strides() || p.sizes().slice(1) != first.sizes().slice(1) ||
        p.storage_offset() != next_offset)
      return false;
    next_offset += p.size(0) * p.stride(0);
  }
  return true;
}

/// Concatenates along dim 0. Consecutive views of one tensor are joined back into a view (no
/// copy, like slice); pieces of one dtype and device are copied straight into a preallocated
/// result (faster than at::cat for few large CPU pieces); anything else goes to at::cat.
at::Tensor cat_rows(const std::vector<at::Tensor>& pieces) {
  const at::Tensor& first = pieces.front();
  if (adjacent_views(pieces)) {
    std::vector<int64_t> shape = first.sizes().vec();
    shape[0] = 0;
    for (const auto& p : pieces) shape[0] += p.size(0);
    return first.as_strided(shape, first.strides(), first.storage_offset());
  }
  const bool uniform = std::all_of(pieces.begin(), pieces.end(), [&](const at::Tensor& p) {
    return p.scalar_type() == first.scalar_type() && p.device() == first.device();
  });
  if (!uniform) return at::cat(pieces, 0);
  int64_t rows = 0;
  for (const auto& p : pieces) rows += p.size(0);
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, first.options().memory_format(at::MemoryFormat::Contiguous));
  int64_t offset = 0;
  for (const auto& p : pieces) {
    out.narrow(0, offset, p.size(0)).copy_(p);
    offset += p.size(0);
  }
  return out;
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << t.sizes() << ' ' << t.device();
  return os.str();
}

/// Applies a row operation to every tensor and column, producing `rows` rows.
template <class TensorOp, class ColumnOp>
DataProto map_rows(const DataProto& d, int64_t rows, TensorOp&& tensor_op, ColumnOp&& column_op) {
  DataProto out;
  const bool has_batch = d.batch.batch_size().has_value();
  out.batch = d.batch.map(tensor_op, has_batch ? std::optional<int64_t>(rows) : std::nullopt);
  for (const auto& [k, col] : d.non_tensor_batch) out.non_tensor_batch[k] = column_op(col);
  out.meta_info = d.meta_info;
  return out;
}

}  // namespace

DataProto::DataProto(TensorDict b, NonTensorBatch n, Json m)
    : batch(std::move(b)), non_tensor_batch(std::move(n)), meta_info(std::move(m)) {
  if (meta_info.is_null()) meta_info = Json::object();
  check_consistency();
}

DataProto DataProto::from_dict(TensorDict tensors, NonTensorBatch non_tensors, Json meta_info,
                               bool auto_padding) {
  if (meta_info.is_null()) meta_info = Json::object();
  if (auto_padding) {
    if (!meta_info.is_object()) throw ValueError("DataProto::from_dict: meta_info must be a JSON object");
    meta_info[kAutoPaddingKey] = true;
  }
  return DataProto(std::move(tensors), std::move(non_tensors), std::move(meta_info));
}

int64_t DataProto::size() const {
  if (auto n = batch.batch_size()) return *n;
  if (!non_tensor_batch.empty()) return static_cast<int64_t>(non_tensor_batch.begin()->second.size());
  return 0;
}

void DataProto::check_consistency() const {
  if (!meta_info.is_object())
    throw ValueError("DataProto: meta_info must be a JSON object, got " + std::string(meta_info.type_name()));
  const int64_t n = size();
  for (const auto& [k, col] : batch)
    if (col.size(0) != n)
      throw ShapeError("DataProto: tensor '" + k + "' has " + str(col.size(0)) + " rows but the batch has " + str(n));
  for (const auto& [k, col] : non_tensor_batch)
    if (static_cast<int64_t>(col.size()) != n)
      throw ShapeError("DataProto: non_tensor_batch['" + k + "'] has " + str(static_cast<int64_t>(col.size())) +
                       " rows but the batch has " + str(n));
}

DataProtoItem DataProto::item(int64_t index) const {
  const int64_t i = normalize_index(index, size(), "item");
  DataProtoItem out;
  for (const auto& [k, t] : batch) out.batch[k] = t[i];
  for (const auto& [k, col] : non_tensor_batch) out.non_tensor_batch[k] = col[static_cast<size_t>(i)];
  out.meta_info = meta_info;
  return out;
}

DataProto DataProto::slice(std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  if (step <= 0) throw ValueError("DataProto::slice: step must be positive, got " + str(step));
  const int64_t n = size();
  auto clamp = [n](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    return std::clamp<int64_t>(x, 0, n);
  };
  const int64_t s = clamp(start, 0);
  const int64_t e = std::max(s, clamp(end, n));
  const int64_t rows = (e - s + step - 1) / step;
  if (step == 1)
    return map_rows(*this, rows, [&](const at::Tensor& t) { return t.slice(0, s, e); },
                    [&](const Column& c) { return take_range(c, s, e); });
  std::vector<int64_t> idx;
  for (int64_t i = s; i < e; i += step) idx.push_back(i);
  return map_rows(*this, rows, [&](const at::Tensor& t) { return t.slice(0, s, e, step); },
                  [&](const Column& c) { return take(c, idx); });
}

DataProto DataProto::select_idxs(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  std::vector<int64_t> idx(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) idx[i] = normalize_index(indices[i], n, "select_idxs");
  const at::Tensor index = index_tensor(idx);
  return map_rows(*this, static_cast<int64_t>(idx.size()),
                  [&](const at::Tensor& t) { return t.index_select(0, index.to(t.device())); },
                  [&](const Column& c) { return take(c, idx); });
}

DataProto DataProto::select_idxs(const std::vector<bool>& mask) const {
  if (static_cast<int64_t>(mask.size()) != size())
    throw ShapeError("DataProto::select_idxs: bool mask has " + str(static_cast<int64_t>(mask.size())) +
                     " entries but the batch has " + str(size()));
  std::vector<int64_t> idx;
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) idx.push_back(static_cast<int64_t>(i));
  return select_idxs(idx);
}

DataProto DataProto::select_idxs(const at::Tensor& indices) const {
  if (indices.dim() != 1)
    throw ShapeError("DataProto::select_idxs: index tensor must be 1-D, got " + describe(indices));
  const at::Tensor cpu = indices.to(at::kCPU).contiguous();
  if (cpu.scalar_type() == at::kBool) {
    std::vector<bool> mask(static_cast<size_t>(cpu.numel()));
    const bool* p = cpu.data_ptr<bool>();
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = p[i];
    return select_idxs(mask);
  }
  if (!at::isIntegralType(cpu.scalar_type(), /*includeBool=*/false))
    throw ValueError("DataProto::select_idxs: index tensor must be integer or bool, got " + describe(indices));
  const at::Tensor as_long = cpu.to(at::kLong).contiguous();
  const int64_t* p = as_long.data_ptr<int64_t>();
  return select_idxs(std::vector<int64_t>(p, p + as_long.numel()));
}

DataProto DataProto::select(const std::optional<std::vector<std::string>>& batch_keys,
                            const std::optional<std::vector<std::string>>& non_tensor_batch_keys,
                            const std::optional<std::vector<std::string>>& meta_info_keys, bool deepcopy) const {
  DataProto out;
  auto copy_tensor = [deepcopy](const at::Tensor& t) { return deepcopy ? t.clone() : t; };
  if (batch_keys) {
    out.batch = batch.batch_size() ? TensorDict::with_batch_size(size()) : TensorDict();
    for (const auto& k : *batch_keys) out.batch.set(k, copy_tensor(batch.at(k)));
  } else {
    out.batch = batch.map(copy_tensor, batch.batch_size());
  }
  if (non_tensor_batch_keys) {
    for (const auto& k : *non_tensor_batch_keys) {
      auto it = non_tensor_batch.find(k);
      if (it == non_tensor_batch.end()) throw KeyError("DataProto::select: no non_tensor_batch key '" + k + "'");
      out.non_tensor_batch[k] = it->second;
    }
  } else {
    out.non_tensor_batch = non_tensor_batch;
  }
  if (meta_info_keys) {
    for (const auto& k : *meta_info_keys) {
      if (!meta_info.contains(k)) throw KeyError("DataProto::select: no meta_info key '" + k + "'");
      out.meta_info[k] = meta_info[k];
    }
  } else {
    out.meta_info = meta_info;
  }
  return out;
}

DataProto DataProto::pop(const std::vector<std::string>& batch_keys,
                         const std::vector<std::string>& non_tensor_batch_keys,
                         const std::vector<std::string>& meta_info_keys) {
  // Check everything first so that a missing key leaves this DataProto untouched.
  for (const auto& k : batch_keys) batch.at(k);
  for (const auto& k : non_tensor_batch_keys)
    if (non_tensor_batch.find(k) == non_tensor_batch.end())
      throw KeyError("DataProto::pop: no non_tensor_batch key '" + k + "'");
  for (const auto& k : meta_info_keys)
    if (!meta_info.contains(k)) throw KeyError("DataProto::pop: no meta_info key '" + k + "'");

  DataProto out;
  out.batch = batch.batch_size() ? TensorDict::with_batch_size(size()) : TensorDict();
  for (const auto& k : batch_keys) out.batch.set(k, batch.pop(k));
  for (const auto& k : non_tensor_batch_keys) {
    auto it = non_tensor_batch.find(k);
    out.non_tensor_batch[k] = std::move(it->second);
    non_tensor_batch.erase(it);
  }
  for (const auto& k : meta_info_keys) {
    out.meta_info[k] = std::move(meta_info[k]);
    meta_info.erase(k);
  }
  return out;
}

DataProto& DataProto::rename(const std::vector<std::string>& old_keys, const std::vector<std::string>& new_keys) {
  if (old_keys.size() != new_keys.size())
    throw ValueError("DataProto::rename: " + str(static_cast<int64_t>(old_keys.size())) + " old keys but " +
                     str(static_cast<int64_t>(new_keys.size())) + " new keys");
  for (size_t i = 0; i < old_keys.size(); ++i) batch.rename(old_keys[i], new_keys[i]);
  return *this;
}

DataProto& DataProto::union_with(const DataProto& other) {
  const auto mine = batch.batch_size(), theirs = other.batch.batch_size();
  if (mine && theirs && *mine != *theirs)
    throw ShapeError("DataProto::union_with: batch sizes differ: " + str(*mine) + " vs " + str(*theirs));
  if (!non_tensor_batch.empty() && !other.non_tensor_batch.empty() && size() != other.size())
    throw ShapeError("DataProto::union_with: sizes differ: " + str(size()) + " vs " + str(other.size()));
  // Validate every conflict before changing anything.
  for (const auto& [k, t] : other.batch)
    if (batch.contains(k) && !tensors_equal(batch.at(k), t))
      throw ValueError("DataProto::union_with: tensor '" + k + "' differs between the two batches (" +
                       describe(batch.at(k)) + " vs " + describe(t) + ")");
  for (const auto& [k, col] : other.non_tensor_batch) {
    auto it = non_tensor_batch.find(k);
    if (it != non_tensor_batch.end() && !json_equal_nan(Json(it->second), Json(col)))
      throw ValueError("DataProto::union_with: non_tensor_batch['" + k + "'] differs between the two batches");
  }
  for (auto it = other.meta_info.begin(); it != other.meta_info.end(); ++it)
    if (meta_info.contains(it.key()) && meta_info[it.key()] != *it)
      throw ValueError("DataProto::union_with: meta_info['" + it.key() + "'] differs: " +
                       meta_info[it.key()].dump() + " vs " + it->dump());
  if (!mine && theirs) {
    TensorDict merged = TensorDict::with_batch_size(*theirs);
    for (const auto& [k, t] : batch) merged.set(k, t);
    batch = std::move(merged);
  }
  for (const auto& [k, t] : other.batch)
    if (!batch.contains(k)) batch.set(k, t);
  for (const auto& [k, col] : other.non_tensor_batch)
    if (non_tensor_batch.find(k) == non_tensor_batch.end()) non_tensor_batch[k] = col;
  for (auto it = other.meta_info.begin(); it != other.meta_info.end(); ++it) meta_info[it.key()] = *it;
  check_consistency();
  return *this;
}

std::vector<DataProto> DataProto::chunk(int64_t chunks) const {
  if (chunks <= 0) throw ValueError("DataProto::chunk: chunks must be positive, got " + str(chunks));
  const int64_t n = size();
  if (n % chunks != 0 && !is_padding_enabled())
    throw ShapeError("DataProto::chunk: " + str(n) + " rows do not split into " + str(chunks) +
                     " equal chunks; pad first or enable auto padding (meta_info['" + kAutoPaddingKey + "'])");
  std::vector<DataProto> out;
  if (n == 0) {
    out.assign(static_cast<size_t>(chunks), slice(0, 0));
    return out;
  }
  const int64_t step = (n + chunks - 1) / chunks;  // torch.chunk: may give fewer chunks
  for (int64_t s = 0; s < n; s += step) out.push_back(slice(s, std::min(n, s + step)));
  return out;
}

std::vector<DataProto> DataProto::split(int64_t split_size) const {
  if (split_size <= 0) throw ValueError("DataProto::split: split_size must be positive, got " + str(split_size));
  const int64_t n = size();
  if (n == 0) return {slice(0, 0)};
  std::vector<DataProto> out;
  for (int64_t s = 0; s < n; s += split_size) out.push_back(slice(s, std::min(n, s + split_size)));
  return out;
}

DataProto DataProto::concat(const std::vector<DataProto>& parts) {
  if (parts.empty()) throw ValueError("DataProto::concat: no parts");
  const DataProto& first = parts.front();
  DataProto out;

  // Tensors: the key set of the first part, every part must have the same keys.
  int64_t total = 0;
  bool any_batch = false;
  for (size_t p = 0; p < parts.size(); ++p) {
    total += parts[p].size();
    any_batch = any_batch || parts[p].batch.batch_size().has_value();
    if (parts[p].batch.size() != first.batch.size())
      throw KeyError("DataProto::concat: part " + str(static_cast<int64_t>(p)) + " has tensor keys " +
                     Json(parts[p].batch.keys()).dump() + " but part 0 has " + Json(first.batch.keys()).dump());
  }
  out.batch = any_batch ? TensorDict::with_batch_size(total) : TensorDict();
  for (const auto& [key, t0] : first.batch) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(parts.size());
    for (size_t p = 0; p < parts.size(); ++p) {
      if (!parts[p].batch.contains(key))
        throw KeyError("DataProto::concat: part " + str(static_cast<int64_t>(p)) + " has no tensor '" + key + "'");
      const at::Tensor& t = parts[p].batch.at(key);
      if (t.sizes().slice(1) != t0.sizes().slice(1))
        throw ShapeError("DataProto::concat: tensor '" + key + "' is " + describe(t) + " in part " +
                         str(static_cast<int64_t>(p)) + " but " + describe(t0) + " in part 0");
      pieces.push_back(t);
    }
    out.batch.set(key, parts.size() == 1 ? pieces[0] : cat_rows(pieces));
  }

  for (const auto& [key, c0] : first.non_tensor_batch) {
    Column merged;
    merged.reserve(static_cast<size_t>(total));
    for (size_t p = 0; p < parts.size(); ++p) {
      auto it = parts[p].non_tensor_batch.find(key);
      if (it == parts[p].non_tensor_batch.end())
        throw KeyError("DataProto::concat: part " + str(static_cast<int64_t>(p)) + " has no non_tensor_batch '" + key +
                       "'");
      merged.insert(merged.end(), it->second.begin(), it->second.end());
    }
    out.non_tensor_batch[key] = std::move(merged);
  }

  // meta_info: plain keys must agree; "metrics" from every part become a dict of lists.
  std::vector<Json> metrics;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (auto it = parts[p].meta_info.begin(); it != parts[p].meta_info.end(); ++it) {
      if (it.key() == "metrics") {
        if (it->is_array())
          metrics.insert(metrics.end(), it->begin(), it->end());
        else if (!it->is_null())
          metrics.push_back(*it);
      } else if (out.meta_info.contains(it.key())) {
        if (out.meta_info[it.key()] != *it)
          throw ValueError("DataProto::concat: meta_info['" + it.key() + "'] conflicts: " +
                           out.meta_info[it.key()].dump() + " vs " + it->dump() + " in part " +
                           str(static_cast<int64_t>(p)));
      } else {
        out.meta_info[it.key()] = *it;
      }
    }
  }
  if (!metrics.empty()) {
    Json gathered = Json::object();
    if (!metrics.front().is_object())
      throw ValueError("DataProto::concat: meta_info['metrics'] entries must be objects");
    for (auto it = metrics.front().begin(); it != metrics.front().end(); ++it) {
      Json values = Json::array();
      for (const Json& m : metrics) {
        if (!m.is_object() || !m.contains(it.key()))
          throw KeyError("DataProto::concat: a metrics entry lacks '" + it.key() + "'");
        values.push_back(m[it.key()]);
      }
      gathered[it.key()] = std::move(values);
    }
    out.meta_info["metrics"] = std::move(gathered);
  }
  out.check_consistency();
  return out;
}

DataProto& DataProto::reorder(const at::Tensor& indices) {
  DataProto reordered = select_idxs(indices);
  batch = std::move(reordered.batch);
  non_tensor_batch = std::move(reordered.non_tensor_batch);
  return *this;
}

DataProto& DataProto::reorder(const std::vector<int64_t>& indices) { return reorder(index_tensor(indices)); }

DataProto DataProto::repeat(int64_t repeat_times, bool interleave) const {
  if (repeat_times < 0) throw ValueError("DataProto::repeat: repeat_times must be >= 0, got " + str(repeat_times));
  const int64_t n = size();
  auto column_op = [&](const Column& c) {
    Column out;
    out.reserve(c.size() * static_cast<size_t>(repeat_times));
    if (interleave) {
      for (const Json& v : c)
        for (int64_t r = 0; r < repeat_times; ++r) out.push_back(v);
    } else {
      for (int64_t r = 0; r < repeat_times; ++r) out.insert(out.end(), c.begin(), c.end());
    }
    return out;
  };
  auto tensor_op = [&](const at::Tensor& t) {
    if (interleave) return t.repeat_interleave(repeat_times, 0);
    std::vector<int64_t> reps(static_cast<size_t>(t.dim()), 1);
    reps[0] = repeat_times;
    return t.repeat(reps);
  };
  return map_rows(*this, n * repeat_times, tensor_op, column_op);
}

DataProto DataProto::sample_level_repeat(const std::vector<int64_t>& repeat_times) const {
  const int64_t n = size();
  if (static_cast<int64_t>(repeat_times.size()) != n)
    throw ShapeError("DataProto::sample_level_repeat: " + str(static_cast<int64_t>(repeat_times.size())) +
                     " repeat counts for " + str(n) + " rows");
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) {
    if (repeat_times[static_cast<size_t>(i)] < 0)
      throw ValueError("DataProto::sample_level_repeat: negative count at row " + str(i));
    for (int64_t r = 0; r < repeat_times[static_cast<size_t>(i)]; ++r) idx.push_back(i);
  }
  return select_idxs(idx);
}

bool DataProto::is_padding_enabled() const {
  auto it = meta_info.find(kAutoPaddingKey);
  return it != meta_info.end() && it->is_boolean() && it->get<bool>();
}

DataProto& DataProto::padding(int64_t padding_size, std::string_view padding_candidate) {
  if (padding_size < 0) throw ValueError("DataProto::padding: negative padding size " + str(padding_size));
  if (padding_size == 0) return *this;
  if (padding_candidate != "" && padding_candidate != "first" && padding_candidate != "last")
    throw ValueError("DataProto::padding: padding_candidate must be \"first\" or \"last\", got \"" +
                     std::string(padding_candidate) + "\"");
  const int64_t n = size();
  if (n == 0) throw ShapeError("DataProto::padding: cannot pad an empty DataProto");
  DataProto pad = select_idxs(std::vector<int64_t>{padding_candidate == "first" ? 0 : n - 1}).repeat(padding_size);
  pad.meta_info = Json::object();
  DataProto self_rows = *this;
  self_rows.meta_info = Json::object();
  DataProto padded = concat({self_rows, pad});
  batch = std::move(padded.batch);
  non_tensor_batch = std::move(padded.non_tensor_batch);
  return *this;
}

DataProto& DataProto::to(const at::Device& device) {
  batch = batch.map([&](const at::Tensor& t) { return t.to(device); }, batch.batch_size());
  return *this;
}

std::vector<IndexGroup> DataProto::group_indices(std::string_view column) const {
  auto it = non_tensor_batch.find(std::string(column));
  if (it == non_tensor_batch.end())
    throw KeyError("DataProto::group_indices: no non_tensor_batch column '" + std::string(column) + "'");
  std::vector<IndexGroup> groups;
  std::unordered_map<std::string, size_t> slot;
  for (size_t i = 0; i < it->second.size(); ++i) {
    const Json& v = it->second[i];
    auto [pos, inserted] = slot.emplace(v.is_string() ? "s" + v.get<std::string>() : v.dump(), groups.size());
    if (inserted) groups.push_back({v, {}});
    groups[pos->second].indices.push_back(static_cast<int64_t>(i));
  }
  return groups;
}

MiniBatchIterator DataProto::make_iterator(const MiniBatchOptions& options) const {
  return MiniBatchIterator(*this, options);
}

std::string DataProto::info() const {
  std::ostringstream os;
  os << "DataProto(size=" << size() << ", batch={";
  bool first = true;
  for (const auto& [k, t] : batch) {
    os << (first ? "" : ", ") << k << ": " << describe(t);
    first = false;
  }
  os << "}, non_tensor_batch={";
  first = true;
  for (const auto& [k, c] : non_tensor_batch) {
    os << (first ? "" : ", ") << k;
    first = false;
  }
  os << "}, meta_info_keys={";
  first = true;
  for (auto it = meta_info.begin(); it != meta_info.end(); ++it) {
    os << (first ? "" : ", ") << it.key();
    first = false;
  }
  os << "})";
  return os.str();
}

DataProto collate(const std::vector<DataProtoItem>& items) {
  if (items.empty()) throw ValueError("collate: no items");
  const DataProtoItem& first = items.front();
  DataProto out;
  out.batch = TensorDict::with_batch_size(static_cast<int64_t>(items.size()));
  for (const auto& [key, t0] : first.batch) {
    std::vector<at::Tensor> rows;
    rows.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      auto it = items[i].batch.find(key);
      if (it == items[i].batch.end())
        throw KeyError("collate: item " + str(static_cast<int64_t>(i)) + " has no tensor '" + key + "'");
      rows.push_back(it->second);
    }
    out.batch.set(key, at::stack(rows, 0));
  }
  for (const auto& [key, v0] : first.non_tensor_batch) {
    Column col;
    col.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      auto it = items[i].non_tensor_batch.find(key);
      if (it == items[i].non_tensor_batch.end())
        throw KeyError("collate: item " + str(static_cast<int64_t>(i)) + " has no non_tensor_batch '" + key + "'");
      col.push_back(it->second);
    }
    out.non_tensor_batch[key] = std::move(col);
  }
  out.meta_info = first.meta_info;
  return out;
}

std::pair<DataProto, int64_t> pad_dataproto_to_divisor(const DataProto& data, int64_t divisor) {
  if (divisor <= 0) throw ValueError("pad_dataproto_to_divisor: divisor must be positive, got " + str(divisor));
  const int64_t n = data.size();
  if (n % divisor == 0) return {data, 0};
  const int64_t pad = divisor - n % divisor;
  std::vector<DataProto> parts{data};
  for (int64_t remaining = pad; remaining > 0;) {
    const int64_t take = std::min(remaining, n);
    DataProto piece = data.slice(0, take);
    piece.meta_info = Json::object();  // padding rows carry no meta (avoids doubling metrics)
    parts.push_back(std::move(piece));
    remaining -= take;
  }
  return {DataProto::concat(parts), pad};
}

DataProto unpad_dataproto(const DataProto& data, int64_t pad_size) {
  if (pad_size < 0 || pad_size > data.size())
    throw ShapeError("unpad_dataproto: cannot remove " + str(pad_size) + " rows from " + str(data.size()));
  return pad_size == 0 ? data : data.slice(0, data.size() - pad_size);
}

}  // namespace hyflow::dataproto
