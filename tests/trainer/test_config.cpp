// Trainer config: verl defaults, INI sections, --key=value overrides, errors naming the key.
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/workers/config.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

using namespace hyflow;
using hyflow::trainer::Config;

namespace {
std::string write_ini(const std::string& text) {
  static int n = 0;
  auto path = std::filesystem::temp_directory_path() /
              ("hyflow_cfg_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".ini");
  std::ofstream(path) << text;
  return path.string();
}
}  // namespace

TEST_CASE("defaults are verl's: gae, train_batch_size 1024, actor lr 1e-6, critic lr 1e-5") {
  Config c;
  CHECK(c.get_string("algorithm.adv_estimator") == "gae");
  CHECK(c.get_int("data.train_batch_size") == 1024);
  CHECK(c.get_double("actor_rollout_ref.actor.optim.lr") == Approx(1e-6));
  CHECK(c.get_double("critic.optim.lr") == Approx(1e-5));
  CHECK(c.is_null("data.val_batch_size"));
  CHECK(c.get_bool("trainer.val_before_train"));
}

TEST_CASE("INI sections set dotted keys and command-line overrides win") {
  const auto ini = write_ini(
      "[algorithm]\nadv_estimator = grpo\n[actor_rollout_ref.rollout]\nn = 4\n"
      "[actor_rollout_ref.actor.optim]\nlr = 3e-4\n");
  Config c;
  const bool help =
      c.apply_arguments({"--config=" + ini, "--actor_rollout_ref.rollout.n=8", "--data.val_batch_size=null"});
  CHECK_FALSE(help);
  CHECK(c.get_string("algorithm.adv_estimator") == "grpo");
  CHECK(c.get_int("actor_rollout_ref.rollout.n") == 8);
  CHECK(c.get_double("actor_rollout_ref.actor.optim.lr") == Approx(3e-4));
  CHECK(c.is_null("data.val_batch_size"));
  std::filesystem::remove(ini);
}

TEST_CASE("subtree gives nested JSON for the workers without null keys") {
  Config c;
  c.set("actor_rollout_ref.model.path", "/m");
  auto t = c.subtree("actor_rollout_ref");
  CHECK(t["model"]["path"] == "/m");
  CHECK(t["rollout"]["val_kwargs"]["n"] == 1);
  CHECK_FALSE(t["actor"].contains("ppo_micro_batch_size_per_gpu"));
  CHECK(t["actor"]["optim"]["betas"] == nlohmann::json::array({0.9, 0.999}));
}

TEST_CASE("unknown keys in files and on the command line name the key") {
  Config c;
  const auto ini = write_ini("[trainer]\ntotal_epoch = 3\n");
  try {
    c.load_ini(ini);
    FAIL("no error");
  } catch (const KeyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("trainer.total_epoch"));
  }
  try {
    c.apply_arguments({"--actor_rollout_ref.rollout.nn=3"});
    FAIL("no error");
  } catch (const KeyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("actor_rollout_ref.rollout.nn"));
  }
  // a prefix of a known key is not guessed
  CHECK_THROWS_WITH(c.apply_arguments({"--trainer.total_epoch=3"}), Catch::Contains("'trainer.total_epoch'"));
  std::filesystem::remove(ini);
}

TEST_CASE("bad values name the key and the value") {
  Config c;
  try {
    c.apply_arguments({"--data.train_batch_size=12x"});
    FAIL("no error");
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("data.train_batch_size") && Catch::Contains("12x"));
  }
  CHECK_THROWS_AS(c.set("trainer.val_before_train", "maybe"), ValueError);
  CHECK_THROWS_AS(c.set("data.train_batch_size", "null"), ValueError);  // not nullable
  CHECK_THROWS_AS(c.get_int("algorithm.adv_estimator"), ValueError);
}

TEST_CASE("--help is reported and the help text lists keys with defaults") {
  Config c;
  CHECK(c.apply_arguments({"--help"}));
  const auto text = c.help_text();
  CHECK_THAT(text, Catch::Contains("--data.train_batch_size=1024"));
  CHECK_THAT(text, Catch::Contains("--algorithm.adv_estimator=gae"));
}

TEST_CASE("the SFT schema has its own keys") {
  Config c(trainer::ConfigSchema::sft);
  CHECK(c.get_int("data.micro_batch_size_per_gpu") == 4);
  CHECK_THROWS_AS(c.set("algorithm.adv_estimator", "grpo"), KeyError);
}

TEST_CASE("every key a role worker reads is a key of the PPO table, with the worker's declared default") {
  const auto& table = hyflow::trainer::config_keys(hyflow::trainer::ConfigSchema::ppo);
  const auto worker_keys = hyflow::workers::worker_config_keys();
  REQUIRE(worker_keys.size() > 60);
  for (const auto& wk : worker_keys) {
    INFO(wk.name);
    auto it = std::find_if(table.begin(), table.end(), [&](const ConfigKey& k) { return k.name == wk.name; });
    REQUIRE(it != table.end());
    CHECK(it->type == wk.type);
    CHECK(it->default_value == wk.default_value);
  }
  // no key is declared twice
  std::set<std::string> names;
  for (const auto& k : table) {
    INFO(k.name);
    CHECK(names.insert(k.name).second);
  }
  // the keys that every app used to reject as unknown
  for (const char* key :
       {"actor_rollout_ref.rollout.min_p", "actor_rollout_ref.actor.calculate_entropy",
        "actor_rollout_ref.actor.tau_pos", "actor_rollout_ref.actor.tau_neg",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio", "actor_rollout_ref.actor.loss_scale_factor",
        "actor_rollout_ref.actor.optim.eps", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu", "reward_model.use_dynamic_bsz"}) {
    INFO(key);
    CHECK(names.count(key) == 1);
  }
  // keys the trainer sets itself are not offered
  CHECK(names.count("actor_rollout_ref.rollout.seed") == 0);
  CHECK(names.count("actor_rollout_ref.actor.optim.total_training_steps") == 0);
}

TEST_CASE("keys set through the app reach the worker config") {
  Config c;
  c.apply_arguments({"--actor_rollout_ref.model.path=/m", "--actor_rollout_ref.rollout.min_p=0.1",
                     "--actor_rollout_ref.actor.calculate_entropy=true", "--actor_rollout_ref.actor.tau_pos=2.5",
                     "--actor_rollout_ref.actor.loss_scale_factor=64",
                     "--actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.01"});
  const auto cfg = hyflow::workers::parse_actor_rollout_ref_config(c.subtree("actor_rollout_ref"));
  CHECK(cfg.rollout.min_p == Approx(0.1));
  CHECK(cfg.actor.calculate_entropy);
  CHECK(cfg.actor.loss.tau_pos == Approx(2.5));
  REQUIRE(cfg.actor.loss.loss_scale_factor.has_value());
  CHECK(*cfg.actor.loss.loss_scale_factor == Approx(64));
  CHECK(cfg.actor.loss.policy_loss.clip_cov_ratio == Approx(0.01));
  // unset keys that inherit from the actor stay unset in the table and inherit in the worker
  Config d;
  d.apply_arguments({"--actor_rollout_ref.model.path=/m", "--actor_rollout_ref.actor.use_dynamic_bsz=true",
                     "--actor_rollout_ref.actor.ppo_max_token_len_per_gpu=999"});
  CHECK(d.is_null("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"));
  const auto inherited = hyflow::workers::parse_actor_rollout_ref_config(d.subtree("actor_rollout_ref"));
  CHECK(inherited.rollout.log_prob.use_dynamic_bsz);
  CHECK(inherited.rollout.log_prob.max_token_len_per_gpu == 999);
  CHECK(inherited.ref.max_token_len_per_gpu == 999);
}

TEST_CASE("an unknown key suggests the closest known one") {
  Config c;
  CHECK_THROWS_WITH(c.apply_arguments({"--trainer.total_epoch=3"}),
                    Catch::Contains("unknown config key 'trainer.total_epoch'") &&
                        Catch::Contains("did you mean 'trainer.total_epochs'?"));
  CHECK_THROWS_WITH(c.set("actor_rollout_ref.rollout.min_q", "0.1"),
                    Catch::Contains("did you mean 'actor_rollout_ref.rollout.min_p'?"));
  const auto ini = write_ini("[actor_rollout_ref.actor]\nppo_epoch = 2\n");
  CHECK_THROWS_WITH(c.load_ini(ini), Catch::Contains("unknown config key 'actor_rollout_ref.actor.ppo_epoch'") &&
                                         Catch::Contains(ini) &&
                                         Catch::Contains("did you mean 'actor_rollout_ref.actor.ppo_epochs'?"));
  CHECK_THROWS_WITH(c.set("zzzz", "1"), !Catch::Contains("did you mean"));
  // the worker names the closest key of its section for keys that reach it directly
  CHECK_THROWS_WITH(hyflow::workers::parse_critic_config({{"model", {{"path", "/m"}}}, {"cliprange_valu", 0.2}}),
                    Catch::Contains("did you mean 'critic.cliprange_value'?"));
}

TEST_CASE("non-finite numbers, values below a key's minimum and repeated INI keys are errors naming the key") {
  Config c;
  for (const char* bad : {"nan", "inf", "-inf", "NaN"}) {
    INFO(bad);
    CHECK_THROWS_WITH(c.set("actor_rollout_ref.actor.optim.lr", bad),
                      Catch::Contains("actor_rollout_ref.actor.optim.lr") && Catch::Contains("finite"));
  }
  CHECK_THROWS_WITH(c.set_json("algorithm.gamma", nlohmann::json(std::nan(""))), Catch::Contains("algorithm.gamma"));
  CHECK_THROWS_WITH(c.set("trainer.total_epochs", "-1"),
                    Catch::Contains("trainer.total_epochs") && Catch::Contains(">= 1"));
  CHECK_THROWS_WITH(c.set("trainer.total_training_steps", "0"), Catch::Contains("trainer.total_training_steps"));
  CHECK_THROWS_WITH(c.set("trainer.critic_warmup", "-2"), Catch::Contains("trainer.critic_warmup"));
  CHECK_THROWS_WITH(c.set("actor_rollout_ref.actor.ppo_epochs", "0"),
                    Catch::Contains("actor_rollout_ref.actor.ppo_epochs") && Catch::Contains(">= 1"));
  CHECK_THROWS_WITH(c.set("actor_rollout_ref.rollout.n", "-4"), Catch::Contains("actor_rollout_ref.rollout.n"));
  c.set("trainer.save_freq", "-1");  // -1: never, as in verl
  c.set("trainer.total_training_steps", "null");
  CHECK(c.get_int("trainer.save_freq") == -1);
  const auto ini = write_ini("[trainer]\ntotal_epochs = 2\nseed = 3\ntotal_epochs = 4\n");
  CHECK_THROWS_WITH(c.load_ini(ini),
                    Catch::Contains("trainer.total_epochs") && Catch::Contains("twice") && Catch::Contains(ini));
  CHECK(c.get_int("trainer.total_epochs") == 30);  // the file was refused before any key was set
  // a worker given a config that bypasses the table checks the same
  CHECK_THROWS_WITH(
      hyflow::workers::parse_actor_rollout_ref_config({{"model", {{"path", "/m"}}}, {"actor", {{"ppo_epochs", -1}}}}),
      Catch::Contains("actor_rollout_ref.actor.ppo_epochs"));
}

TEST_CASE("lists take verl's (Hydra's) syntax: single or double quotes or none, numbers typed") {
  Config c;
  c.apply_arguments({"--trainer.logger=['console','jsonl']"});
  CHECK(c.get("trainer.logger") == nlohmann::json::array({"console", "jsonl"}));
  c.set("trainer.logger", R"(["console", "file"])");
  CHECK(c.get("trainer.logger") == nlohmann::json::array({"console", "file"}));
  c.set("trainer.logger", "[console, jsonl]");
  CHECK(c.get("trainer.logger") == nlohmann::json::array({"console", "jsonl"}));
  c.set("trainer.logger", "console,jsonl");  // the plain comma list stays accepted
  CHECK(c.get("trainer.logger") == nlohmann::json::array({"console", "jsonl"}));
  c.set("trainer.logger", "[]");
  CHECK(c.get("trainer.logger") == nlohmann::json::array());
  c.set("actor_rollout_ref.actor.optim.betas", "[0.9, 0.95]");
  CHECK(c.get("actor_rollout_ref.actor.optim.betas") == nlohmann::json::array({0.9, 0.95}));
  c.set("actor_rollout_ref.actor.checkpoint.save_contents", "['model', 'hf_model']");
  CHECK(c.get("actor_rollout_ref.actor.checkpoint.save_contents") == nlohmann::json::array({"model", "hf_model"}));
  c.set("trainer.logger", "['1']");  // quoted: a string, not a number
  CHECK(c.get("trainer.logger") == nlohmann::json::array({"1"}));
  CHECK_THROWS_WITH(c.set("trainer.logger", "['console'"),
                    Catch::Contains("trainer.logger") && Catch::Contains("['console'"));
  CHECK_THROWS_WITH(c.set("trainer.logger", "[['a']]"), Catch::Contains("trainer.logger") && Catch::Contains("flat"));
  const auto ini = write_ini("[trainer]\nlogger = ['console', 'jsonl']\n");
  Config d;
  d.load_ini(ini);
  CHECK(d.get("trainer.logger") == nlohmann::json::array({"console", "jsonl"}));
  std::filesystem::remove(ini);
}

TEST_CASE("trainer.prometheus.* are keys of both schemas: port (null), bind (127.0.0.1), token_file (null)") {
  Config c;
  CHECK(c.is_null("trainer.prometheus.port"));
  CHECK(c.get_string("trainer.prometheus.bind") == "127.0.0.1");
  CHECK(c.is_null("trainer.prometheus.token_file"));
  CHECK_THROWS_WITH(c.apply_arguments({"--trainer.prometheus.prot=9"}),
                    Catch::Contains("did you mean 'trainer.prometheus.port'?"));
  CHECK_THROWS_WITH(c.set("trainer.prometheus.port", "-1"), Catch::Contains("trainer.prometheus.port"));
  c.set("trainer.logger", "console,prometheus");
  // the port is required with the tracker: checked when the config is read, before any loading
  CHECK_THROWS_WITH(trainer::read_ppo_config(c), Catch::Contains("'trainer.prometheus.port' is required"));

  Config sft(trainer::ConfigSchema::sft);
  CHECK(sft.is_null("trainer.prometheus.port"));
  CHECK_THROWS_WITH(sft.apply_arguments({"--trainer.prometheus.bnd=x"}),
                    Catch::Contains("did you mean 'trainer.prometheus.bind'?"));
}
