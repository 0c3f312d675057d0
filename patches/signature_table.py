"""SGLang signatures, per release, of every symbol the plugin hooks or calls (patches/signatures.py).

Written by ``python -m tools.survey_signatures`` from the released wheels of 0.5.17..0.5.23; do not edit.
Each row maps the first release of a parameter list to it; None: absent from that release on.
"""

from __future__ import annotations

SIGNATURES: dict[str, dict[str, str | None]] = {
    "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd": {
        "0.5.17": "(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, has_mla, use_pdl, page_size, score_mod, aux_tensors)",
        "0.5.19": "(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, has_mla, use_pdl, page_size, score_mod, aux_tensors, enable_lean, lean_Mp, lean_Lp, lean_Op, lean_locks)",
        "0.5.23": "(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, has_mla, use_pdl, page_size, score_mod, aux_tensors, enable_lean, lean_Mp, lean_Lp, lean_Op, lean_locks, uneven_batch)",
    },
    "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd": {
        "0.5.17": "(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale, logit_cap, skip_prefix_custom_mask, sliding_window_size, sinks, window_kv_offsets, xai_temperature_len, lse_extend, skip_prefix, skip_extend, page_size, score_mod, aux_tensors)",
        "0.5.18": "(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale, logit_cap, skip_prefix_custom_mask, sliding_window_size, sinks, window_kv_offsets, xai_temperature_len, lse_extend, skip_prefix, skip_extend, page_size, score_mod, aux_tensors, extend_seq_lens_cpu)",
        "0.5.20": "(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale, logit_cap, skip_prefix_custom_mask, sliding_window_size, sinks, window_kv_offsets, xai_temperature_len, lse_extend, skip_prefix, skip_extend, page_size, score_mod, aux_tensors, extend_seq_lens_cpu, identity_kv_indices)",
    },
    "sglang.kernels.ops.attention.kv_indices.create_flashinfer_kv_indices_triton": {
        "0.5.23": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE, TOKEN_BLOCK_PARALLEL, token_mapping)",
    },
    "sglang.kernels.ops.kvcache.kv_indices.create_flashinfer_kv_indices_triton": {
        "0.5.17": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride)",
        "0.5.19": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE)",
        "0.5.20": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE, TOKEN_BLOCK_PARALLEL)",
        "0.5.22": "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, req_to_token_ptr_stride, ENTRY_PAGE_SIZE, TOKEN_BLOCK_PARALLEL, token_mapping)",
        "0.5.23": None,
    },
    "sglang.kernels.ops.memory.common.write_req_to_token_pool_triton": {
        "0.5.17": "(req_to_token_ptr, req_pool_indices, prefix_tensors, pre_lens, seq_lens, extend_lens, out_cache_loc, req_to_token_ptr_stride)",
    },
    "sglang.kernels.ops.sampling.murmur_hash.murmur_hash32": {
        "0.5.17": "(seed, positions, col_indices)",
    },
    "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform": {
        "0.5.17": "(req_pool_indices, req_to_token, start_offset, out_cache_loc, pool_len, draft_token_num)",
        "0.5.23": "(req_pool_indices, req_to_token, start_offset, out_cache_loc, pool_len, draft_token_num, full_v2p, swa_v2p, full_out, swa_out, PAGE_SIZE, num_v_pages, num_swa_pages, positions_out, anchor_src, anchor_out, anchor_stride)",
    },
    "sglang.kernels.ops.speculative.eagle.fill_bonus_tokens": {
        "0.5.17": "(accept_tokens, accept_lens, bonus_tokens_ptr, accept_stride)",
    },
    "sglang.srt.arg_groups.model_override_base.attention_backends_of": {
        "0.5.19": "(cfg)",
    },
    "sglang.srt.arg_groups.model_override_base.resolved_view": {
        "0.5.19": "(server_args)",
    },
    "sglang.srt.configs.model_config.ModelConfig.from_server_args": {
        "0.5.17": "(server_args, model_path, model_revision, is_draft_model, context_length, **kwargs)",
    },
    "sglang.srt.entrypoints.http_server._wait_and_warmup": {
        "0.5.17": "(server_args, launch_callback, execute_warmup_func)",
        "0.5.23": "(server_args, launch_callback, execute_warmup_func, post_warmup_callback)",
    },
    "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat": {
        "0.5.17": "(self, request, raw_request)",
    },
    "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate": {
        "0.5.17": "(self, request, raw_request)",
    },
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.__init__": {
        "0.5.17": "(self, tokenizer_manager)",
    },
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase._compute_extra_key": {
        "0.5.17": "(self, request)",
        "0.5.18": None,
    },
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._handle_last_assistant_message": {
        "0.5.17": "(self, messages, request)",
    },
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages": {
        "0.5.17": "(self, request, is_multimodal)",
        "0.5.23": "(self, request, is_multimodal, *, output_constrained)",
    },
    "sglang.srt.entrypoints.warmup.execute_warmups": {
        "0.5.17": "(disaggregation_mode, warmup_names, tokenizer_manager)",
    },
    "sglang.srt.layers.attention.base_attn_backend.AttentionBackend.update_verify_buffers_to_fill_after_draft": {
        "0.5.17": "(self, spec_info, cuda_graph_bs)",
    },
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__": {
        "0.5.17": "(self, model_runner, skip_prefill, kv_indptr_buf)",
        "0.5.22": "(self, model_runner, skip_prefill, kv_indptr_buf, *, dllm_fa4)",
    },
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend": {
        "0.5.17": "(self, q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod, aux_tensors)",
    },
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.get_num_kv_splits": {
        "0.5.17": "(self, num_kv_splits, seq_lens)",
        "0.5.23": "(self, num_kv_splits, seq_lens, uneven_batch)",
    },
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata": {
        "0.5.17": "(self, forward_batch)",
    },
    "sglang.srt.layers.dp_attention.set_dp_buffer_len": {
        "0.5.17": "(global_dp_buffer_len, local_dp_buffer_len, dp_max_padding, global_num_tokens, global_num_tokens_gpu)",
    },
    "sglang.srt.layers.dp_attention.set_is_extend_in_batch": {
        "0.5.17": "(is_extend_in_batch)",
    },
    "sglang.srt.layers.logits_processor.LogitsProcessorOutput": {
        "0.5.17": "(next_token_logits, hidden_states, next_token_logprobs, next_token_top_logprobs_val, next_token_top_logprobs_idx, next_token_token_ids_logprobs_val, next_token_token_ids_logprobs_idx, next_token_sampling_mask_idx, next_token_sampling_logprobs, input_token_logprobs, input_top_logprobs_val, input_top_logprobs_idx, input_token_ids_logprobs_val, input_token_ids_logprobs_idx, full_logits, customized_info, mm_input_embeds)",
        "0.5.19": "(next_token_logits, hidden_states, next_token_logprobs, next_token_top_logprobs_val, next_token_top_logprobs_idx, next_token_token_ids_logprobs_val, next_token_token_ids_logprobs_idx, next_token_sampling_mask_idx, next_token_sampling_logprobs, input_token_logprobs, input_top_logprobs_val, input_top_logprobs_idx, input_token_ids_logprobs_val, input_token_ids_logprobs_idx, full_logits, beam, customized_info, mm_input_embeds, auxiliary_device_output)",
        "0.5.20": "(next_token_logits, hidden_states, next_token_logprobs, next_token_top_logprobs_val, next_token_top_logprobs_idx, next_token_token_ids_logprobs_val, next_token_token_ids_logprobs_idx, sampling_mask_output, next_token_sampling_mask_idx, next_token_sampling_logprobs, next_token_sampling_mask_status, input_token_logprobs, input_top_logprobs_val, input_top_logprobs_idx, input_token_ids_logprobs_val, input_token_ids_logprobs_idx, full_logits, beam, customized_info, mm_input_embeds, auxiliary_device_output)",
        "0.5.21": "(next_token_logits, hidden_states, hidden_states_token_indices, next_token_logprobs, next_token_top_logprobs_val, next_token_top_logprobs_idx, next_token_token_ids_logprobs_val, next_token_token_ids_logprobs_idx, sampling_mask_output, next_token_sampling_mask_idx, next_token_sampling_logprobs, next_token_sampling_mask_status, input_token_logprobs, input_top_logprobs_val, input_top_logprobs_idx, input_token_ids_logprobs_val, input_token_ids_logprobs_idx, input_logprobs_copy_done, full_logits, beam, customized_info, mm_input_embeds, auxiliary_device_output)",
        "0.5.23": "(next_token_logits, hidden_states, hidden_states_token_indices, last_hidden_states, next_token_logprobs, next_token_top_logprobs_val, next_token_top_logprobs_idx, next_token_token_ids_logprobs_val, next_token_token_ids_logprobs_idx, sampling_mask_output, next_token_sampling_mask_idx, next_token_sampling_logprobs, next_token_sampling_mask_status, input_token_logprobs, input_top_logprobs_val, input_top_logprobs_idx, input_token_ids_logprobs_val, input_token_ids_logprobs_idx, input_logprobs_copy_done, full_logits, beam, customized_info, mm_input_embeds, auxiliary_device_output)",
    },
    "sglang.srt.layers.logprob_processor.compute_spec_logprobs": {
        "0.5.18": "(batch, logits_output, predict, *, accept_index, chain_stride)",
    },
    "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs": {
        "0.5.17": "(batch, logits_output, predict, accept_index, speculative_num_steps)",
        "0.5.18": None,
    },
    "sglang.srt.layers.sampler.Sampler.forward": {
        "0.5.17": "(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions)",
        "0.5.22": "(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions, *, logprob_logits)",
    },
    "sglang.srt.layers.sampler.apply_custom_logit_processor": {
        "0.5.17": "(logits, sampling_batch_info, num_tokens_in_batch)",
    },
    "sglang.srt.managers.io_struct.GenerateReqInput.__getitem__": {
        "0.5.17": "(self, i)",
    },
    "sglang.srt.managers.io_struct.GenerateReqInput._determine_batch_size": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.io_struct.msgpack_decode": {
        "0.5.17": "(data)",
    },
    "sglang.srt.managers.io_struct.msgpack_encode": {
        "0.5.17": "(obj)",
    },
    "sglang.srt.managers.overlap_utils.FutureMap.__init__": {
        "0.5.17": "(self, device, spec_algo, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)",
    },
    "sglang.srt.managers.schedule_batch.Req.update_finish_state": {
        "0.5.17": "(self, new_accepted_len)",
    },
    "sglang.srt.managers.schedule_batch.retract_all": {
        "0.5.17": "(*, reqs, server_args, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, hisparse_coordinator, offload_kv)",
        "0.5.19": "(*, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, hisparse_coordinator, offload_kv)",
    },
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": {
        "0.5.17": "(self, req, has_chunked_req, truncation_align_size)",
    },
    "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw": {
        "0.5.17": "(self, prefill_delayer_single_pass, running_batch)",
    },
    "sglang.srt.managers.scheduler.Scheduler.abort_request": {
        "0.5.17": "(self, recv_req)",
    },
    "sglang.srt.managers.scheduler.Scheduler.get_internal_state": {
        "0.5.17": "(self, recv_req)",
    },
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run": {
        "0.5.17": "(self, running_batch, last_batch)",
    },
    "sglang.srt.managers.scheduler.Scheduler.handle_generate_request": {
        "0.5.17": "(self, recv_req)",
        "0.5.19": "(self, recv_req, *, mm_input_error)",
    },
    "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.scheduler.Scheduler.init_memory_pools": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.scheduler.Scheduler.init_metrics_reporter": {
        "0.5.17": "(self, tp_rank, pp_rank, dp_rank)",
        "0.5.21": "(self)",
    },
    "sglang.srt.managers.scheduler.Scheduler.init_startup_timing_summary": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.scheduler.Scheduler.is_fully_idle": {
        "0.5.17": "(self, for_health_check)",
        "0.5.21": "(self, for_health_check, ignore_waiting)",
    },
    "sglang.srt.managers.scheduler.Scheduler.pause_generation": {
        "0.5.17": "(self, recv_req)",
    },
    "sglang.srt.managers.scheduler.Scheduler.update_running_batch": {
        "0.5.17": "(self, batch)",
    },
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor._resolve_spec_v2_tokens": {
        "0.5.17": "(self, result, batch)",
    },
    "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer.get_loads": {
        "0.5.17": "(self)",
    },
    "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept": {
        "0.5.17": "(self, *, req)",
    },
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics": {
        "0.5.17": "(self, meta_info, recv_obj, i)",
    },
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object": {
        "0.5.17": "(self, obj, input_text, input_ids, input_embeds, mm_inputs, token_type_ids)",
    },
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request": {
        "0.5.17": "(self, obj, input_ids)",
    },
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request": {
        "0.5.17": "(self, obj, request)",
    },
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": {
        "0.5.17": "(self, batch, forward_batch, pp_proxy_tensors, is_verify, skip_attn_backend_init, *, capture_hidden_mode)",
        "0.5.22": "(self, batch, forward_batch, pp_proxy_tensors, is_verify, skip_attn_backend_init, *, capture_hidden_mode, return_kv_loc_plan)",
    },
    "sglang.srt.managers.utils.GenerationBatchResult": {
        "0.5.17": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_start_event, fpm_end_event)",
        "0.5.19": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_start_event, fpm_end_event, auxiliary_host_output)",
        "0.5.20": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, speculative_output_stride, num_non_draft_tokens_per_req, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_start_event, fpm_end_event, auxiliary_host_output)",
        "0.5.21": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, speculative_output_stride, num_non_draft_tokens_per_req, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, next_verify_chain, next_verify_parent_list, next_verify_top_scores_index, spec_verify_out_cache_loc, accept_index, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_start_event, fpm_end_event, auxiliary_host_output)",
        "0.5.22": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, speculative_output_stride, num_non_draft_tokens_per_req, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, next_verify_chain, next_verify_parent_list, next_verify_top_scores_index, spec_verify_out_cache_loc, kv_loc_plan, accept_index, prepared_draft_extend_inputs, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_start_event, fpm_end_event, auxiliary_host_output)",
        "0.5.23": "(logits_output, pp_hidden_states_proxy_tensors, next_token_ids, num_correct_drafts, num_correct_drafts_per_req_cpu, num_block_accept_tokens, num_cap_tokens, accept_length_per_req_cpu, dllm_algo_state, can_run_cuda_graph, skipped_output_comm, extend_input_len_per_req, extend_logprob_start_len_per_req, copy_done, delay_sample_func, future_indices, speculative_num_draft_tokens, speculative_output_stride, num_non_draft_tokens_per_req, grammar_advanced, grammar_retained_tokens, accept_lens, block_accept_lens, cap_lens, new_seq_lens, next_draft_input, next_verify_chain, next_verify_parent_list, next_verify_top_scores_index, spec_verify_out_cache_loc, kv_loc_plan, accept_index, prepared_draft_extend_inputs, extra_keep_alive_refs, routed_experts_output, indexer_topk_output, expert_distribution_metrics, fpm_timing, fpm_scheduled_requests, auxiliary_host_output)",
    },
    "sglang.srt.managers.utils.compute_num_reserved_tokens": {
        "0.5.17": "(server_args)",
        "0.5.18": "()",
    },
    "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode": {
        "0.5.17": "(server_args)",
        "0.5.18": "()",
    },
    "sglang.srt.mem_cache.common.evict_from_tree_cache": {
        "0.5.17": "(tree_cache, num_tokens)",
    },
    "sglang.srt.mem_cache.common.release_kv_cache": {
        "0.5.17": "(req, tree_cache, is_insert)",
        "0.5.22": "(req, tree_cache, *, checkpoint)",
    },
    "sglang.srt.mem_cache.kv_cache_builder.get_draft_kv_pool": {
        "0.5.17": "(*, draft_worker, spec_algorithm, server_args)",
        "0.5.18": None,
        "0.5.19": "(*, draft_worker, spec_algorithm, server_args)",
        "0.5.21": None,
    },
    "sglang.srt.mem_cache.pool_host.mha.get_mha_host_pool_cls": {
        "0.5.17": "(device_pool)",
        "0.5.23": "(buffer_info)",
    },
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new": {
        "0.5.17": "(cls, batch, model_runner, *, capture_hidden_mode, return_hidden_states_before_norm)",
        "0.5.22": "(cls, batch, model_runner, *, capture_hidden_mode, return_hidden_states_before_norm, extend_position_info, spec_mrope_positions, kv_loc_plan, write_cols)",
    },
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.mark_forward_metadata_ready": {
        "0.5.17": "(self, replan_equivalent)",
    },
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": {
        "0.5.17": "(self)",
    },
    "sglang.srt.model_executor.runner.base_cuda_graph_runner.freeze_gc": {
        "0.5.17": "(enable_cudagraph_gc)",
    },
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__": {
        "0.5.17": "(self, model_runner, *, attn_backend, speculative_num_steps, speculative_num_draft_tokens)",
        "0.5.20": "(self, model_runner, *, attn_backend, speculative_num_steps, speculative_num_draft_tokens, record_nolora_graph)",
    },
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph": {
        "0.5.17": "(self, forward_batch)",
    },
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.execute": {
        "0.5.17": "(self, forward_batch, pp_proxy_tensors)",
    },
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info": {
        "0.5.17": "(self, num_tokens)",
    },
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.load_batch": {
        "0.5.17": "(self, forward_batch, pp_proxy_tensors)",
    },
    "sglang.srt.model_executor.runner.get_batch_sizes_to_capture": {
        "0.5.17": "(model_runner, captured_req_width)",
        "0.5.22": "(model_runner, captured_req_width, *, gathered_buffer_required)",
    },
    "sglang.srt.observability.startup_time.aggregate_scheduler_startup_times": {
        "0.5.17": "(startup_times)",
    },
    "sglang.srt.runtime_context.RuntimeContext.override": {
        "0.5.17": "(self, source, **fields)",
    },
    "sglang.srt.sampling.penaltylib.repetition_penalty.apply_scaling_penalties": {
        "0.5.17": "(logits, scaling_penalties)",
    },
    "sglang.srt.server_args.ServerArgs.__post_init__": {
        "0.5.17": "(self)",
    },
    "sglang.srt.server_args.ServerArgs.add_cli_args": {
        "0.5.17": "(parser)",
    },
    "sglang.srt.server_args.ServerArgs.from_cli_args": {
        "0.5.17": "(cls, args)",
    },
    "sglang.srt.server_args.ServerArgs.get_attention_backends": {
        "0.5.17": "(self)",
        "0.5.19": None,
    },
    "sglang.srt.server_args.ServerArgs.resolve_once": {
        "0.5.19": "(self)",
    },
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.alloc_memory_pool": {
        "0.5.17": "(self, memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)",
    },
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.clear_cache_pool": {
        "0.5.17": "(self)",
    },
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.init_attention_backends": {
        "0.5.17": "(self)",
    },
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.init_cuda_graphs": {
        "0.5.17": "(self)",
    },
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.on_verify_complete_cpu": {
        "0.5.17": "(self, num_correct_drafts_per_req, batch_size)",
    },
    "sglang.srt.speculative.eagle_info.EagleVerifyInput": {
        "0.5.17": "(draft_token, custom_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, retrieve_cum_len, spec_steps, topk, draft_token_num, capture_hidden_mode, seq_lens_sum, seq_lens_cpu, draft_probs, num_tokens_per_req)",
        "0.5.22": "(draft_token, custom_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, retrieve_cum_len, spec_steps, topk, draft_token_num, capture_hidden_mode, seq_lens_sum, seq_lens_cpu, draft_probs, prepared_out_cache_loc, prepared_mrope_positions, kv_loc_plan, num_tokens_per_req)",
    },
    "sglang.srt.speculative.eagle_utils._verify_coins": {
        "0.5.17": "(*, sampling_info, seq_lens, draft_token_num, candidates, device)",
    },
    "sglang.srt.speculative.eagle_utils.alloc_for_spec_decode": {
        "0.5.17": "(tree_cache, req_to_token_pool, *, reqs, req_pool_indices, cur_kv_lens, cur_kv_lens_cpu, nxt_kv_lens, nxt_kv_lens_cpu, num_needed_tokens, batch)",
    },
    "sglang.srt.speculative.eagle_utils.default_tree_mask_mode": {
        "0.5.17": "()",
    },
    "sglang.srt.speculative.eagle_utils.eagle_sample": {
        "0.5.17": "(verify_input, batch, logits_output, grammar_mask)",
        "0.5.20": "(verify_input, batch, logits_output, grammar_mask, uno_target_max_top_k)",
        "0.5.22": "(verify_input, batch, logits_output, grammar_mask, uno_target_max_top_k, *, watermark_state, watermark_full_mask)",
    },
    "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input": {
        "0.5.17": "(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, *, target_worker, topk, num_steps, num_draft_tokens, tree_mask_mode, device)",
    },
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__": {
        "0.5.17": "(self, server_args, gpu_id, ps, nccl_port, target_worker)",
        "0.5.21": "(self, server_args, gpu_id, nccl_port, target_worker)",
    },
    "sglang.srt.speculative.spec_info.create_dummy_verify_input": {
        "0.5.17": "(spec_algorithm, server_args, custom_mask, num_tokens_per_req, is_draft_worker)",
        "0.5.18": "(spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker)",
    },
    "sglang.srt.speculative.spec_registry.register_algorithm": {
        "0.5.17": "(name, *, supports_overlap, validate_server_args, spec_class)",
    },
    "sglang.srt.speculative.spec_utils.GrammarTree.from_device": {
        "0.5.17": "(cls, retrieve_next_token, retrieve_next_sibling, draft_token)",
    },
    "sglang.srt.speculative.spec_utils.build_grammar_vocab_mask": {
        "0.5.17": "(*, reqs, tree, sampling_info, device, barrier)",
    },
    "sglang.srt.speculative.spec_utils.get_plan_stream": {
        "0.5.17": "(device)",
    },
    "sglang.srt.speculative.spec_utils.record_stream_each": {
        "0.5.17": "(tensors, stream)",
    },
    "sglang.srt.speculative.spec_utils.record_stream_for_v2_verify": {
        "0.5.17": "(batch, verify_input, fwd_stream)",
    },
    "sglang.srt.utils.async_probe.maybe_detect_inf": {
        "0.5.17": "(tensor, msg)",
    },
    "sglang.srt.utils.async_probe.maybe_detect_nan": {
        "0.5.17": "(tensor, msg)",
    },
    "sglang.srt.utils.async_probe.maybe_detect_oob": {
        "0.5.17": "(indices, low, high, msg)",
    },
    "sglang.srt.utils.async_probe.sanitize_nan_logits": {
        "0.5.17": "(logits, msg)",
    },
}
