// Datasets (JSONL, built-in arithmetic and char_count tasks, padding/truncation) and reward managers.
#include <hyflow/algos/reward_score.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/reward_manager.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

using namespace hyflow;
using namespace hyflow::trainer;

namespace {
std::shared_ptr<const tokenizers::Tokenizer> char_tok() { return std::make_shared<tokenizers::CharTokenizer>(); }

std::string write_file(const std::string& text) {
  static int n = 0;
  auto path = std::filesystem::temp_directory_path() /
              ("hyflow_ds_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".jsonl");
  std::ofstream(path) << text;
  return path.string();
}

/// A rollout batch: prompts (left-padded, P=4) and responses (right-padded, T=5).
DataProto rollout(const std::vector<std::string>& prompts, const std::vector<std::string>& responses,
                  const std::vector<std::string>& truths) {
  auto tok = char_tok();
  const int64_t B = static_cast<int64_t>(prompts.size()), P = 4, T = 5;
  auto p = torch::full({B, P}, tok->pad_token_id(), torch::kLong),
       r = torch::full({B, T}, tok->pad_token_id(), torch::kLong);
  auto mask = torch::zeros({B, P + T}, torch::kLong);
  dataproto::Column ds, rm;
  for (int64_t i = 0; i < B; ++i) {
    auto pi = tok->encode(prompts[i]);
    auto ri = tok->encode(responses[i]);
    for (size_t t = 0; t < pi.size(); ++t) p[i][P - pi.size() + t] = pi[t], mask[i][P - pi.size() + t] = 1;
    for (size_t t = 0; t < ri.size(); ++t) r[i][t] = ri[t], mask[i][P + t] = 1;
    ds.emplace_back("arithmetic");
    rm.push_back({{"ground_truth", truths[i]}});
  }
  dataproto::NonTensorBatch nt;
  nt["data_source"] = ds;
  nt["reward_model"] = rm;
  return DataProto(TensorDict{{"prompts", p}, {"responses", r}, {"attention_mask", mask}}, nt);
}
}  // namespace

TEST_CASE("JSONL rows with chat prompts, data_source, ground truth and extra_info") {
  const auto f = write_file(
      R"({"prompt": [{"role": "user", "content": "1+2="}], "data_source": "arithmetic", )"
      R"("reward_model": {"ground_truth": "3"}, "extra_info": {"index": 7}})"
      "\n\n"
      R"({"prompt": "4+4=", "data_source": "arithmetic", "reward_model": {"ground_truth": "8"}})"
      "\n");
  auto rows = read_jsonl(f);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].prompt == "1+2=");
  CHECK(rows[0].ground_truth == "3");
  CHECK(rows[0].extra_info["index"] == 7);
  CHECK(rows[1].prompt == "4+4=");
  std::filesystem::remove(f);
}

TEST_CASE("a bad JSONL line is a FormatError naming file:line") {
  const auto f = write_file("{\"prompt\": \"1+1=\"}\n{\"prompt\": \"2+2=\"\n");
  try {
    read_jsonl(f);
    FAIL("no error");
  } catch (const FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains(f + ":2"));
  }
  const auto g = write_file("{\"question\": \"1+1=\"}\n");
  CHECK_THROWS_WITH(read_jsonl(g), Catch::Contains(g + ":1") && Catch::Contains("prompt"));
  std::filesystem::remove(f);
  std::filesystem::remove(g);
}

TEST_CASE("an empty JSONL file is a FormatError naming the file") {
  for (const char* text : {"", "\n  \n\t\n"}) {
    const auto f = write_file(text);
    CHECK_THROWS_WITH(read_jsonl(f), Catch::Contains(f) && Catch::Contains("no rows"));
    std::filesystem::remove(f);
  }
}

TEST_CASE("a garbage tokenizer_config.json is a FormatError naming the file, not a missing tokenizer") {
  const auto dir = std::filesystem::temp_directory_path() / ("hyflow_tokcfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = (dir / "tokenizer_config.json").string();
  std::ofstream(file) << "{\"tokenizer_class\": \"hyflow-char\",";  // cut off
  CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(file) && Catch::Contains("not valid JSON"));
  std::ofstream(file, std::ios::trunc) << "[1, 2]";
  CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(file) && Catch::Contains("JSON object"));
  std::ofstream(file, std::ios::trunc) << "{\"tokenizer_class\": 7}";
  CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(file) && Catch::Contains("tokenizer_class"));
  // chat special tokens of the char tokenizer (agent loops need the template's end of turn as eos)
  std::ofstream(file, std::ios::trunc) << R"({"tokenizer_class": "hyflow-char", "eos_token": "<|im_end|>",
      "special_tokens": ["<pad>", "<|im_start|>", "<|im_end|>"]})";
  const auto chat = load_tokenizer(dir.string());
  CHECK(chat->eos_token_id() == 2);
  const std::vector<int64_t> ids = {1, *chat->token_to_id("a"), *chat->token_to_id("b"), 2};
  CHECK(chat->encode("<|im_start|>ab<|im_end|>") == ids);
  std::ofstream(file, std::ios::trunc) << R"({"tokenizer_class": "hyflow-char", "special_tokens": "<pad>"})";
  CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(file) && Catch::Contains("special_tokens"));
  std::ofstream(file, std::ios::trunc) << R"({"tokenizer_class": "hyflow-char", "eos_token": 2})";
  CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(file) && Catch::Contains("eos_token"));
  std::ofstream(file, std::ios::trunc) << "{\"tokenizer_class\": \"hyflow-char\"}";
  const auto tokenizer = load_tokenizer(dir.string());
  CHECK(tokenizer->vocab_size() > 0);
  SECTION("a tokenizer with ids beyond the model's vocab_size is refused when loading, naming both") {
    models::save_config(models::tiny_config(tokenizer->vocab_size() - 1), dir / "config.json");
    CHECK_THROWS_WITH(load_tokenizer(dir.string()), Catch::Contains(dir.string()) && Catch::Contains("vocab_size"));
    models::save_config(models::tiny_config(tokenizer->vocab_size()), dir / "config.json");
    CHECK(load_tokenizer(dir.string())->vocab_size() == tokenizer->vocab_size());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("arithmetic task: deterministic in the seed, sums as ground truth") {
  auto a = make_arithmetic_task(20, 9, 5), b = make_arithmetic_task(20, 9, 5), c = make_arithmetic_task(20, 9, 6);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].prompt == b[i].prompt);
    differs |= a[i].prompt != c[i].prompt;
    const auto plus = a[i].prompt.find('+');
    const int x = std::stoi(a[i].prompt.substr(0, plus)), y = std::stoi(a[i].prompt.substr(plus + 1));
    CHECK(a[i].ground_truth == std::to_string(x + y));
    CHECK(a[i].response == std::to_string(x + y));
  }
  CHECK(differs);
}

TEST_CASE("multiplication task: 4-digit operands, products as ground truth, held-out problems never in training") {
  SyntheticTask train{.task = "multiplication", .size = 3000, .max_operand = 4, .seed = 1};
  SyntheticTask val = train;
  val.size = 400;
  val.seed = 1 + 7919;
  val.held_out = true;
  const auto rows = load_samples("", train), held = load_samples("", val);
  REQUIRE(rows.size() == 3000);
  REQUIRE(held.size() == 400);
  std::set<std::string> seen;
  for (const auto& s : rows) {
    const auto star = s.prompt.find('*');
    const int64_t a = std::stoll(s.prompt.substr(0, star)), b = std::stoll(s.prompt.substr(star + 1));
    CHECK((a >= 1000 && a <= 9999 && b >= 1000 && b <= 9999));
    CHECK(s.prompt == std::to_string(a) + "*" + std::to_string(b) + "=");
    CHECK(s.ground_truth == std::to_string(a * b));
    CHECK(s.response == std::to_string(a * b));
    CHECK(s.data_source == "arithmetic");
    CHECK(!multiplication_held_out(a, b));
    seen.insert(s.prompt);
  }
  for (const auto& s : held) {
    const auto star = s.prompt.find('*');
    CHECK(multiplication_held_out(std::stoll(s.prompt.substr(0, star)), std::stoll(s.prompt.substr(star + 1))));
    CHECK(seen.count(s.prompt) == 0);
  }
  // the split is the pair's, not the seed's: a held-out draw with the training seed is still disjoint
  val.seed = train.seed;
  for (const auto& s : load_samples("", val)) CHECK(seen.count(s.prompt) == 0);
  CHECK(make_multiplication_task(50, 4, 9, false)[7].prompt == make_multiplication_task(50, 4, 9, false)[7].prompt);
  CHECK_THROWS_WITH(make_multiplication_task(5, 10, 1, false), Catch::Contains("data.synthetic.max_operand"));
  CHECK_THROWS_AS(make_multiplication_task(5, 0, 1, false), ValueError);
}

TEST_CASE("multiplication chat tasks: the tool agent loop's ids, loss on the model's turns, training problems only") {
  SyntheticTask sft{.task = "multiplication_calculator", .size = 300, .max_operand = 4, .seed = 0};
  sft.chat.default_system = "Call the calculator.";
  const auto rows = load_samples("", sft);
  REQUIRE(rows.size() == 600);  // two turns per problem
  const auto problems = make_multiplication_task(300, 4, 0, false);
  const std::string head = "<|im_start|>system\nCall the calculator.<|im_end|>\n<|im_start|>user\n";
  auto tok = std::make_shared<tokenizers::CharTokenizer>(tokenizers::chat_char_options());
  // the PPO trainer's validation draw (ppo_trainer.cpp: seed + 7919, held out)
  std::set<std::string> validation;
  for (const auto& s : make_multiplication_task(512, 4, 7919, true)) validation.insert(s.prompt);
  for (size_t k = 0; k < problems.size(); ++k) {
    const Sample& call = rows[2 * k];
    const Sample& answer = rows[2 * k + 1];
    const std::string q = problems[k].prompt, product = problems[k].ground_truth.get<std::string>();
    const std::string expression = q.substr(0, q.size() - 1);
    CHECK(call.prompt == head + q + "<|im_end|>\n<|im_start|>assistant\n");
    CHECK(call.response == "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" + expression +
                               "\"}}\n</tool_call>");
    // what the tool agent loop holds after the call: prompt, sampled call, end token, the template's tool turn
    CHECK(answer.prompt == call.prompt + call.response + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + product +
                               "\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    CHECK(answer.response == product);
    CHECK(answer.ground_truth == product);
    CHECK(call.extra_info["turn"] == "call");
    CHECK(answer.extra_info["turn"] == "answer");
    const auto star = q.find('*');
    CHECK(!multiplication_held_out(std::stoll(q.substr(0, star)), std::stoll(q.substr(star + 1))));
    CHECK(validation.count(q) == 0);
  }
  // the loss falls on the model's turns: the call (row 0) and the answer (row 1), each with its end token
  SFTDataset ds({rows[0], rows[1]}, tok, 256);
  const auto b = ds.batch({0, 1});
  CHECK(b.batch.at("loss_mask")[0].sum().item<int64_t>() == static_cast<int64_t>(rows[0].response.size()) + 1);
  CHECK(b.batch.at("loss_mask")[1].sum().item<int64_t>() == static_cast<int64_t>(rows[1].response.size()) + 1);
  const int64_t answer_prompt = static_cast<int64_t>(tok->encode(rows[1].prompt).size());
  CHECK(b.batch.at("loss_mask")[1].narrow(0, 0, answer_prompt).sum().item<int64_t>() == 0);

  sft.task = "multiplication_chat";  // the answer at once, for the baseline without the tool
  const auto direct = load_samples("", sft);
  REQUIRE(direct.size() == 300);
  CHECK(direct[4].prompt == rows[8].prompt);
  CHECK(direct[4].response == "The product is " + problems[4].ground_truth.get<std::string>() + ".");
  CHECK(is_chat_task("multiplication_chat"));
  CHECK(!is_chat_task("multiplication"));
  // tool_fraction: that share of the problems through the tool (two rows), the others answered at once (one row);
  // the problems themselves do not change with it
  sft.task = "multiplication_calculator";
  sft.tool_fraction = 0.4;
  const auto mixed = load_samples("", sft);
  size_t k = 0, with_tool = 0;
  for (size_t i = 0; i < mixed.size(); ++k) {
    const std::string product = problems[k].ground_truth.get<std::string>();
    CHECK(mixed[i].prompt == direct[k].prompt);
    if (mixed[i].extra_info["turn"] == "call") {
      ++with_tool;
      REQUIRE(i + 1 < mixed.size());
      CHECK(mixed[i].response == rows[2 * k].response);
      CHECK(mixed[i + 1].prompt == rows[2 * k + 1].prompt);
      CHECK(mixed[i + 1].response == product);
      i += 2;
    } else {
      CHECK(mixed[i].response == direct[k].response);
      i += 1;
    }
  }
  CHECK(k == problems.size());
  CHECK(with_tool > 90);  // 0.4 of 300: 120 expected, sd 8.5
  CHECK(with_tool < 150);
  sft.tool_fraction = 1.5;
  CHECK_THROWS_AS(load_samples("", sft), ValueError);
  sft.tool_fraction = 1.0;
  // a template without tool calls cannot render the call
  sft.chat.chat_template = tokenizers::ChatTemplate::kChatML;
  CHECK_THROWS_AS(load_samples("", sft), ValueError);
}

TEST_CASE("char_count task: verl-recipe prompts, a spelled-out count, the count as ground truth") {
  const auto a = make_char_count_task(200, 8, 3), b = make_char_count_task(200, 8, 3),
             c = make_char_count_task(200, 8, 4);
  const std::string head = "How many ", middle = " are there in word ";
  bool differs = false;
  std::set<int64_t> lengths, counts;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].prompt == b[i].prompt);
    CHECK(a[i].response == b[i].response);
    differs |= a[i].prompt != c[i].prompt;
    const auto& p = a[i].prompt;
    REQUIRE(p.rfind(head, 0) == 0);
    REQUIRE(p.substr(head.size() + 1, middle.size()) == middle);
    REQUIRE(p.back() == '?');
    const char target = p[head.size()];
    const std::string dashed = p.substr(head.size() + 1 + middle.size(), p.size() - head.size() - middle.size() - 2);
    std::string word, steps;
    for (size_t k = 0; k < dashed.size(); ++k) {
      if (k % 2 == 1) {
        REQUIRE(dashed[k] == '-');
        continue;
      }
      REQUIRE(std::islower(static_cast<unsigned char>(dashed[k])));
      word += dashed[k];
      steps += std::string(1, dashed[k]) + (dashed[k] == target ? " = " : " != ") + target + ".\n";
    }
    const auto hits = std::count(word.begin(), word.end(), target);
    const auto others = static_cast<int64_t>(word.size()) - hits;
    CHECK(hits >= 1);
    CHECK(hits <= 4);
    CHECK((others == 3 || others == 4));
    lengths.insert(static_cast<int64_t>(word.size()));
    counts.insert(hits);
    CHECK(a[i].data_source == "char_count");
    CHECK(a[i].ground_truth == std::to_string(hits));
    CHECK(a[i].response == steps + "<answer>" + std::to_string(hits) + "</answer>");
    CHECK(algos::reward_score::default_compute_score("char_count", a[i].response, a[i].ground_truth).score == 1.0);
  }
  CHECK(differs);
  CHECK(lengths == std::set<int64_t>{4, 5, 6, 7, 8});
  CHECK(counts == std::set<int64_t>{1, 2, 3, 4});
}

TEST_CASE("char_count task: the held-out draws share no prompt with the training draws of the configs") {
  // config/sft_char_count.ini and config/grpo_char_count.ini: training seeds 0 (SFT) and 1 (GRPO),
  // 4096 prompts each, words of at most 7 letters; the trainers draw the held-out prompts with seed + 7919.
  std::set<std::string> train;
  for (uint64_t seed : {0, 1})
    for (const auto& r : make_char_count_task(4096, 7, seed)) train.insert(r.prompt);
  CHECK(train.size() > 8100);  // the training draws themselves barely repeat
  int64_t shared = 0;
  for (const auto& r : make_char_count_task(512, 7, 1 + 7919)) shared += train.count(r.prompt) ? 1 : 0;
  for (const auto& r : make_char_count_task(128, 7, 0 + 7919)) shared += train.count(r.prompt) ? 1 : 0;
  CHECK(shared == 0);
}

TEST_CASE("char_count task: correct_fraction spoils that share of SFT answers; bad sizes are errors") {
  const auto rows = make_char_count_task(400, 6, 9, 0.5);
  int right = 0;
  for (const auto& r : rows) {
    const double score = algos::reward_score::default_compute_score("char_count", r.response, r.ground_truth).score;
    right += score == 1.0 ? 1 : 0;
  }
  CHECK(right > 150);
  CHECK(right < 250);
  REQUIRE_THROWS_AS(make_char_count_task(4, 4, 0), ValueError);  // no room for 3 other letters and the count
  REQUIRE_THROWS_WITH(make_char_count_task(4, 4, 0), Catch::Contains("data.synthetic.max_operand"));
  CHECK(make_char_count_task(3, 5, 0).size() == 3);
  REQUIRE_THROWS_AS(make_char_count_task(-1, 5, 0), ValueError);
}

TEST_CASE("built-in tasks by name: arithmetic and char_count; an unknown one names the key") {
  SyntheticTask t{.task = "char_count", .size = 10, .max_operand = 5, .seed = 2};
  const auto rows = load_samples("", t);
  REQUIRE(rows.size() == 10);
  CHECK(rows[0].prompt == make_char_count_task(10, 5, 2)[0].prompt);
  t.task = "arithmetic";
  CHECK(load_samples("", t)[0].data_source == "arithmetic");
  t.task = "char-count";
  REQUIRE_THROWS_AS(load_samples("", t), ValueError);
  REQUIRE_THROWS_WITH(load_samples("", t), Catch::Contains("data.synthetic.task") && Catch::Contains("char_count"));
}

TEST_CASE("char_count rows tokenize with the char tokenizer for RL and SFT") {
  const auto rows = make_char_count_task(50, 8, 1);
  RLDataset rl(rows, char_tok(), {.max_prompt_length = 45});  // the longest: 8 letters
  CHECK(rl.size() == 50);
  SFTDataset sft(rows, char_tok(), 128);
  CHECK(sft.size() == 50);
}

TEST_CASE("RL batch: prompts left-padded to max_prompt_length with verl position ids") {
  std::vector<Sample> s(2);
  s[0].prompt = "1+2=";
  s[1].prompt = "10+20=";
  RLDataset ds(s, char_tok(), {.max_prompt_length = 8});
  auto b = ds.batch({0, 1});
  CHECK(b.batch.at("input_ids").sizes() == at::IntArrayRef({2, 8}));
  CHECK(b.batch.at("attention_mask")[0].sum().item<int64_t>() == 4);
  CHECK(b.batch.at("attention_mask")[0][3].item<int64_t>() == 0);
  CHECK(b.batch.at("position_ids")[1][2].item<int64_t>() == 0);
  CHECK(b.batch.at("position_ids")[1][7].item<int64_t>() == 5);
  CHECK(b.non_tensor_batch.at("extra_info")[1]["index"] == 1);
}

TEST_CASE("overlong prompts: error names the row, filter drops, left/right/middle truncate") {
  std::vector<Sample> s(2);
  s[0].prompt = "1+2=";
  s[1].prompt = "123456+7=";
  CHECK_THROWS_WITH(RLDataset(s, char_tok(), {.max_prompt_length = 5}), Catch::Contains("row 1"));
  CHECK(RLDataset(s, char_tok(), {.max_prompt_length = 5, .filter_overlong_prompts = true}).size() == 1);
  auto tok = char_tok();
  auto text = [&](const std::string& mode) {
    RLDataset ds(s, tok, {.max_prompt_length = 4, .truncation = mode});
    auto ids = ds.batch({1}).batch.at("input_ids")[0];
    return tok->decode(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 4));
  };
  CHECK(text("left") == "6+7=");
  CHECK(text("right") == "1234");
  CHECK(text("middle") == "127=");
}

TEST_CASE("SFT batch: loss mask covers the response and eos, right padding") {
  std::vector<Sample> s(1);
  s[0].prompt = "1+2=";
  s[0].response = "3";
  SFTDataset ds(s, char_tok(), 8);
  auto b = ds.batch({0});
  auto lm = b.batch.at("loss_mask")[0];
  CHECK(lm.sum().item<int64_t>() == 2);
  CHECK(lm[4].item<int64_t>() == 1);
  CHECK(lm[5].item<int64_t>() == 1);
  CHECK(b.batch.at("attention_mask")[0].sum().item<int64_t>() == 6);
  CHECK(b.batch.at("input_ids")[0][5].item<int64_t>() == char_tok()->eos_token_id());
}

TEST_CASE("epoch order: a seeded permutation per epoch, identity without shuffle") {
  CHECK(epoch_order(5, false, 1, 3) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(epoch_order(50, true, 1, 0) == epoch_order(50, true, 1, 0));
  CHECK(epoch_order(50, true, 1, 0) != epoch_order(50, true, 1, 1));
}

TEST_CASE("naive manager puts the score at the last valid response token") {
  RewardManager rm(char_tok(), {});
  auto out = rm(rollout({"1+2=", "5+5="}, {"3", "11"}, {"3", "10"}));
  REQUIRE(out.reward_tensor.sizes() == at::IntArrayRef({2, 5}));
  CHECK(out.reward_tensor[0][0].item<float>() == 1.0f);
  CHECK(out.reward_tensor[0].sum().item<float>() == 1.0f);
  CHECK(out.reward_tensor[1].sum().item<float>() == 0.0f);
}

TEST_CASE("agent rollouts are scored on the model's last turn, never on a tool's output") {
  // Each response is turns of (text, response_mask): the model's call, the tool's answer 6 (mask 0), the model's end.
  const std::vector<std::vector<std::pair<std::string, int64_t>>> rows = {
      {{"c 2*3 ", 1}, {"6 ", 0}, {"6", 1}},      // answers 6 after the tool: right
      {{"c 2*3 ", 1}, {"6 ", 0}, {"five", 1}},   // no number in its last turn: wrong
      {{"c 2*3 ", 1}, {"6", 0}},                 // cut after the tool turn: no answer
      {{"6", 1}}};                               // no tool call
  auto tok = char_tok();
  const int64_t B = 4, P = 4, T = 16;
  auto p = torch::full({B, P}, tok->pad_token_id(), torch::kLong);
  auto r = torch::full({B, T}, tok->pad_token_id(), torch::kLong);
  auto mask = torch::zeros({B, P + T}, torch::kLong), response_mask = torch::zeros({B, T}, torch::kLong);
  dataproto::Column ds, rm_col, turns;
  for (int64_t i = 0; i < B; ++i) {
    const auto pi = tok->encode("2*3=");
    for (int64_t t = 0; t < P; ++t) p[i][t] = pi[static_cast<size_t>(t)], mask[i][t] = 1;
    int64_t t = 0;
    for (const auto& [text, m] : rows[static_cast<size_t>(i)])
      for (int64_t id : tok->encode(text)) r[i][t] = id, mask[i][P + t] = 1, response_mask[i][t++] = m;
    ds.emplace_back("arithmetic");
    rm_col.push_back({{"ground_truth", "6"}});
    turns.emplace_back(static_cast<int64_t>(rows[static_cast<size_t>(i)].size()) + 1);
  }
  dataproto::NonTensorBatch nt{{"data_source", ds}, {"reward_model", rm_col}};
  RewardManager rm(tok, {});
  const DataProto single(TensorDict{{"prompts", p}, {"responses", r}, {"attention_mask", mask}}, nt);
  // without the agent columns the whole response is the answer, as before
  CHECK(rm(single).reward_tensor.sum(-1).equal(torch::tensor({1.0F, 1.0F, 1.0F, 1.0F})));
  nt["__num_turns__"] = turns;
  const DataProto agent(
      TensorDict{{"prompts", p}, {"responses", r}, {"attention_mask", mask}, {"response_mask", response_mask}}, nt);
  const auto out = rm(agent).reward_tensor;
  CHECK(out.sum(-1).equal(torch::tensor({1.0F, 0.0F, 0.0F, 1.0F})));
  CHECK(out[0][8].item<float>() == 1.0F);  // at the last valid id, as for a single turn
}

TEST_CASE("dapo manager: overlong penalty from the buffer and acc logged") {
  RewardManagerOptions o{
      .name = "dapo", .max_response_length = 5, .overlong_buffer = {.enable = true, .len = 2, .penalty_factor = 1.0}};
  RewardManager rm(char_tok(), o);
  // lengths 1 and 5: expected 3 -> penalties 0 and -(5-3)/2 = -1
  auto out = rm(rollout({"1+2=", "5+5="}, {"3", "00010"}, {"3", "10"}));
  CHECK(out.reward_tensor[0][0].item<float>() == Approx(1.0));
  CHECK(out.reward_tensor[1][4].item<float>() == Approx(1.0 - 1.0));
  CHECK(out.reward_extra_info.at("overlong_reward")[1] == Approx(-1.0));
  CHECK(out.reward_extra_info.at("acc").size() == 2);
}

TEST_CASE("batch manager calls a registered batch function once for all rows") {
  int calls = 0;
  register_batch_compute_score(
      "test_len",
      [&](const std::vector<std::string>&, const std::vector<std::string>& sols, const std::vector<nlohmann::json>&,
          const std::vector<nlohmann::json>&) {
        ++calls;
        std::vector<algos::reward_score::ScoreResult> r;
        for (const auto& s : sols) r.push_back({static_cast<double>(s.size()), {{"len", s.size()}}});
        return r;
      },
      true);
  RewardManager rm(char_tok(), {.name = "batch", .compute_score = "test_len"});
  auto out = rm(rollout({"1+2=", "5+5="}, {"3", "110"}, {"3", "10"}));
  CHECK(calls == 1);
  CHECK(out.reward_tensor[1][2].item<float>() == 3.0f);
  CHECK(out.reward_extra_info.at("len")[0] == 1);
}

TEST_CASE("custom per-row reward functions by name; unknown names and managers are errors") {
  algos::reward_score::register_compute_score(
      "always_half", [](auto&&, auto&&, auto&&, auto&&) { return algos::reward_score::ScoreResult{0.5, {}}; }, true);
  RewardManager rm(char_tok(), {.compute_score = "always_half"});
  CHECK(rm(rollout({"1+2="}, {"9"}, {"3"})).reward_tensor[0][0].item<float>() == 0.5f);
  CHECK_THROWS_AS(RewardManager(char_tok(), {.compute_score = "nope"}), KeyError);
  CHECK_THROWS_WITH(RewardManager(char_tok(), {.name = "prime"}), Catch::Contains("reward_model.reward_manager"));
}

TEST_CASE("rm_scores in the batch are returned as the reward") {
  auto data = rollout({"1+2="}, {"3"}, {"3"});
  data.batch.set("rm_scores", torch::full({1, 5}, 0.25));
  RewardManager rm(char_tok(), {});
  CHECK(rm(data).reward_tensor.sum().item<float>() == Approx(1.25));
}

TEST_CASE("a reward plugin (custom_reward_function.path) registers functions the managers use") {
  CHECK_THROWS_AS(algos::reward_score::get_compute_score("plugin_length_score"), KeyError);
  load_reward_plugin(REWARD_PLUGIN_PATH);
  load_reward_plugin(REWARD_PLUGIN_PATH);  // again: nothing happens
  RewardManager rm(char_tok(), {.compute_score = "plugin_length_score"});
  auto out = rm(rollout({"1+2=", "5+5="}, {"3", "1"}, {"3", "10"}));
  CHECK(out.reward_tensor[0][0].item<float>() == 1.0f);
  CHECK(out.reward_tensor[1].sum().item<float>() == 0.0f);
  CHECK(out.reward_extra_info.at("length")[1] == 1.0);
}

TEST_CASE("a reward plugin that is missing or not a library is a ValueError naming it") {
  CHECK_THROWS_WITH(load_reward_plugin("/nonexistent/libreward.so"), Catch::Contains("/nonexistent/libreward.so"));
  const auto not_a_library = write_file("not an ELF file");
  CHECK_THROWS_AS(load_reward_plugin(not_a_library), ValueError);
  CHECK_THROWS_WITH(load_reward_plugin(not_a_library), Catch::Contains(not_a_library));
}

TEST_CASE("the reward function sees the rollout's tool and interaction scores (verl's rollout_reward_scores)") {
  // verl's managers: extra_info["rollout_reward_scores"] = the row's reward_scores ({} without),
  // extra_info["num_turns"] = its __num_turns__ (null without)
  algos::reward_score::register_compute_score(
      "tool_score_sum",
      [](auto&&, auto&&, auto&&, const nlohmann::json& extra) {
        double sum = 0;
        for (const auto& [name, value] : extra.at("rollout_reward_scores").items()) sum += value.template get<double>();
        return algos::reward_score::ScoreResult{
            sum, {{"turns", extra.at("num_turns")}, {"index", extra.value("index", nlohmann::json())}}};
      },
      true);
  auto data = rollout({"1+2=", "5+5="}, {"3", "10"}, {"3", "10"});
  data.non_tensor_batch["extra_info"] = {nlohmann::json{{"index", 4}}, nlohmann::json()};
  RewardManager naive(char_tok(), {.compute_score = "tool_score_sum"});
  auto plain = naive(data);
  CHECK(plain.reward_tensor.sum().item<float>() == 0.0f);
  CHECK(plain.reward_extra_info.at("turns")[0].is_null());
  CHECK(plain.reward_extra_info.at("index")[0] == 4);  // the dataset's extra_info is kept
  data.non_tensor_batch["reward_scores"] = {nlohmann::json{{"calculator", 0.25}, {"interaction", 0.5}},
                                            nlohmann::json::object()};
  data.non_tensor_batch["__num_turns__"] = {nlohmann::json(4), nlohmann::json(2)};
  auto scored = naive(data);
  CHECK(scored.reward_tensor[0].sum().item<float>() == Approx(0.75));
  CHECK(scored.reward_tensor[1].sum().item<float>() == 0.0f);
  CHECK(scored.reward_extra_info.at("turns")[0] == 4);
  CHECK(data.non_tensor_batch.at("extra_info")[0] == nlohmann::json{{"index", 4}});  // the batch is not changed
  std::vector<nlohmann::json> seen;
  register_batch_compute_score(
      "batch_tool_scores",
      [&](const std::vector<std::string>&, const std::vector<std::string>& sols, const std::vector<nlohmann::json>&,
          const std::vector<nlohmann::json>& extras) {
        seen = extras;
        return std::vector<algos::reward_score::ScoreResult>(sols.size());
      },
      true);
  RewardManager batch(char_tok(), {.name = "batch", .compute_score = "batch_tool_scores"});
  (void)batch(data);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].at("rollout_reward_scores").at("interaction") == 0.5);
  CHECK(seen[1].at("rollout_reward_scores") == nlohmann::json::object());
  CHECK(seen[1].at("num_turns") == 2);
}
